"""The exceptions of the ``yutu`` package.

Every exception a call raises is a :class:`Error`. ``code`` is the node's S3 error code
(``"NoSuchKey"``, ``"AccessDenied"``...) when the failure is the node's answer, else ``None``;
the message is the node's own.
"""


class Error(Exception):
    """A Yutu call failed."""

    code = None


class NotFound(Error):
    """The key is not stored."""


class BucketNotFound(NotFound):
    """The bucket does not exist (and the store was told not to create it)."""


class NoSpace(Error):
    """The node cannot hold the data (a bucket over quota, a disk bucket whose NVMe is full)."""


class AuthError(Error):
    """The node refused the credentials (401) or the permission (403)."""


class InvalidArgument(Error, ValueError):
    """The arguments are wrong: sizes, unregistered pointers, buffers too small, bad keys."""


class Busy(Error):
    """The node or the client is overloaded; retry later."""


class Unavailable(Error, ConnectionError):
    """The node cannot be reached."""


class TransferError(Error):
    """Moving the bytes between the node and this process failed."""


class Closed(Error):
    """A call on a store after ``close()``."""


class DeviceError(Error):
    """A GPU call failed: no CUDA driver, memory that is not the device's, a failed copy."""
