//! A GetObject answer: the object's metadata plus its body as a stream.
//!
//! Objects can be many GiB, so the body is never collected here: [`GetObject`] implements
//! [`Read`] straight over the connection (ureq's unlimited `into_reader`, not its 10 MB
//! `read_to_vec`). ureq fails the read if the connection closes before `Content-Length`
//! bytes arrived, so a short read cannot pass for a whole object.

use std::io::{self, Read};

use ureq::BodyReader;

use crate::error::ClientError;
use crate::object::ObjectInfo;

/// An object being downloaded. Read it to the end to get the bytes.
pub struct GetObject {
    /// Metadata of the whole object (`info.size` is the full size even for a range).
    pub info: ObjectInfo,
    /// How many bytes this body delivers.
    pub content_length: u64,
    /// `(first, last)` inclusive, when the server answered with a part (206). `None` when the
    /// whole object is coming, including when a range was asked for and the server chose to
    /// ignore it, as RFC 9110 allows.
    pub range: Option<(u64, u64)>,
    pub(crate) body: BodyReader<'static>,
}

impl Read for GetObject {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }
}

impl std::fmt::Debug for GetObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetObject")
            .field("info", &self.info)
            .field("content_length", &self.content_length)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// The `Range` header for `(first, last)`; `last` is inclusive and `None` means "to the end".
pub(crate) fn range_header(range: (u64, Option<u64>)) -> Result<String, ClientError> {
    match range {
        (first, None) => Ok(format!("bytes={first}-")),
        (first, Some(last)) if last >= first => Ok(format!("bytes={first}-{last}")),
        (first, Some(last)) => Err(ClientError::InvalidArgument(format!(
            "range end {last} is before its start {first}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_headers() {
        assert_eq!(range_header((0, Some(9))).unwrap(), "bytes=0-9");
        assert_eq!(range_header((5, None)).unwrap(), "bytes=5-");
        assert_eq!(range_header((7, Some(7))).unwrap(), "bytes=7-7");
        // An inverted range would be ignored by the server, which would then send the
        // whole object: refuse it before it costs a transfer.
        assert!(matches!(
            range_header((9, Some(0))),
            Err(ClientError::InvalidArgument(_))
        ));
    }
}
