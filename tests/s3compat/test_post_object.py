"""POST Object (browser form uploads) through boto3's generate_presigned_post at default
settings (SigV4), a hand-signed SigV2 form, and unsigned forms; every policy violation is
refused and stores nothing."""

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from botocore.exceptions import ClientError

from conftest import ALICE, fresh_bucket



def form_post(url, fields, filename="hello.txt", content=b"hello world", file_type="text/plain"):
    """POSTs a multipart/form-data form, the file last as browsers send it: (status, headers, body)."""
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        )
    parts.append(
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: {file_type}\r\n\r\n"
        ).encode()
        + content
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    req = urllib.request.Request(
        url,
        data=b"".join(parts),
        method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **kw):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    lower = lambda hs: {k.lower(): v for k, v in hs.items()}  # noqa: E731
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, lower(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, lower(e.headers), e.read()


def exists(s3, b, k):
    try:
        s3.head_object(Bucket=b, Key=k)
        return True
    except ClientError:
        return False


@pytest.mark.parametrize("version", ["default (SigV2)", "s3v4"])
def test_a_presigned_post_uploads_and_reads_back(server, s3, version):
    b = fresh_bucket(s3, "post")
    signer = server.client(signature_version="s3v4") if version == "s3v4" else s3
    post = signer.generate_presigned_post(
        b,
        "uploads/${filename}",
        Fields={"success_action_status": "201", "Content-Type": "text/plain"},
        Conditions=[
            ["starts-with", "$key", "uploads/"],
            ["content-length-range", 1, 1024],
            {"success_action_status": "201"},
            ["eq", "$Content-Type", "text/plain"],
        ],
    )
    assert post["url"].rstrip("/").endswith(b)
    status, h, body = form_post(post["url"], post["fields"], "notes.txt", b"form bytes")
    assert status == 201, body
    assert b"<Key>uploads/notes.txt</Key>" in body and b"<PostResponse" in body
    got = s3.get_object(Bucket=b, Key="uploads/notes.txt")
    assert got["Body"].read() == b"form bytes"
    assert got["ContentType"] == "text/plain"
    assert got["ETag"] == h["etag"]
    # 204 by default; a redirect when asked for one.
    post = s3.generate_presigned_post(
        b, "plain", Fields={"success_action_redirect": "http://app.example.com/done"},
        Conditions=[{"success_action_redirect": "http://app.example.com/done"}],
    )
    status, h, _ = form_post(post["url"], post["fields"])
    assert status == 303
    assert h["location"].startswith("http://app.example.com/done?bucket=")
    assert "key=plain" in h["location"]
    post = s3.generate_presigned_post(b, "default")
    assert form_post(post["url"], post["fields"])[0] == 204


def test_policy_violations_are_refused_and_store_nothing(server, s3):
    b = fresh_bucket(s3, "post")
    post = s3.generate_presigned_post(
        b, "k", Conditions=[["content-length-range", 1, 10]]
    )
    status, _, body = form_post(post["url"], post["fields"], content=b"x" * 11)
    assert status == 400 and b"EntityTooLarge" in body, body
    assert not exists(s3, b, "k")
    # A key the policy does not allow.
    post = s3.generate_presigned_post(b, "ok/${filename}", Conditions=[["starts-with", "$key", "ok/"]])
    fields = dict(post["fields"], key="elsewhere/x")
    status, _, body = form_post(post["url"], fields)
    assert status == 403 and b"AccessDenied" in body, body
    assert not exists(s3, b, "elsewhere/x")
    # A field the policy does not name.
    fields = dict(post["fields"], **{"x-amz-meta-extra": "1"})
    status, _, body = form_post(post["url"], fields)
    assert status == 403, body
    # A tampered signature, and a forged policy.
    fields = dict(post["fields"])
    fields["signature"] = base64.b64encode(b"0" * 20).decode()
    status, _, body = form_post(post["url"], fields)
    assert status == 403 and b"SignatureDoesNotMatch" in body, body
    forged = json.loads(base64.b64decode(post["fields"]["policy"]))
    forged["conditions"] = [c for c in forged["conditions"] if not isinstance(c, list)]
    fields = dict(post["fields"], policy=base64.b64encode(json.dumps(forged).encode()).decode())
    assert form_post(post["url"], fields)[0] == 403
    # Another bucket than the policy's.
    other = fresh_bucket(s3, "post")
    status, _, _ = form_post(f"{server.url}/{other}", post["fields"])
    assert status == 403
    assert s3.list_objects_v2(Bucket=b).get("KeyCount", 0) == 0
    assert s3.list_objects_v2(Bucket=other).get("KeyCount", 0) == 0


def sigv2_form(bucket, key, conditions, expiration):
    policy = base64.b64encode(
        json.dumps({"expiration": expiration, "conditions": conditions}).encode()
    ).decode()
    sig = base64.b64encode(
        hmac.new(ALICE[1].encode(), policy.encode(), hashlib.sha1).digest()
    ).decode()
    return {"key": key, "AWSAccessKeyId": ALICE[0], "policy": policy, "signature": sig}


def test_sigv2_forms_and_expiry(server, s3):
    b = fresh_bucket(s3, "post")
    later = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() + 3600))
    fields = sigv2_form(b, "v2", [{"bucket": b}, {"key": "v2"}], later)
    assert form_post(f"{server.url}/{b}", fields)[0] == 204
    assert s3.get_object(Bucket=b, Key="v2")["Body"].read() == b"hello world"
    past = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 60))
    fields = sigv2_form(b, "old", [{"bucket": b}, {"key": "old"}], past)
    status, _, body = form_post(f"{server.url}/{b}", fields)
    assert status == 403 and b"expired" in body.lower(), body
    assert not exists(s3, b, "old")


def test_unsigned_forms_follow_the_bucket_acl(server, s3):
    open_rw = fresh_bucket(s3, "post", ACL="public-read-write")
    private = fresh_bucket(s3, "post")
    status, _, _ = form_post(f"{server.url}/{open_rw}", {"key": "anon", "acl": "public-read"})
    assert status == 204
    assert s3.get_object(Bucket=open_rw, Key="anon")["Body"].read() == b"hello world"
    status, _, body = form_post(f"{server.url}/{private}", {"key": "anon"})
    assert status == 403, body
    assert not exists(s3, private, "anon")
    # A body that is not a form at all.
    req = urllib.request.Request(
        f"{server.url}/{open_rw}",
        data=b"--x\r\nnot a form",
        method="POST",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400


def test_the_201_answer_has_no_namespace_as_s3_writes_it(server, s3):
    import xml.etree.ElementTree as ET

    b = fresh_bucket(s3, "post")
    post = s3.generate_presigned_post(
        b, "foo.txt", Fields={"success_action_status": "201"},
        Conditions=[{"success_action_status": "201"}],
    )
    status, _, body = form_post(post["url"], post["fields"])
    assert status == 201, body
    root = ET.fromstring(body)
    assert root.find("Key").text == "foo.txt"
    assert root.find("Bucket").text == b


def test_a_checksum_field_is_checked_against_the_file_not_the_policy(server, s3):
    b = fresh_bucket(s3, "post")
    content = b"checked bytes"
    good = base64.b64encode(hashlib.sha256(content).digest()).decode()
    post = s3.generate_presigned_post(b, "c.txt")
    fields = dict(post["fields"], **{"x-amz-checksum-sha256": good})
    status, _, body = form_post(post["url"], fields, content=content)
    assert status == 204, body
    assert s3.get_object(Bucket=b, Key="c.txt")["Body"].read() == content
    bad = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    post = s3.generate_presigned_post(b, "d.txt")
    fields = dict(post["fields"], **{"x-amz-checksum-sha256": bad})
    status, _, body = form_post(post["url"], fields, content=content)
    assert status == 400 and b"BadDigest" in body, body
    assert not exists(s3, b, "d.txt")
