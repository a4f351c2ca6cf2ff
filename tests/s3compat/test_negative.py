"""Bad credentials and bad bodies: each gets S3's error, and nothing partial becomes visible."""

import datetime
import http.client
import zlib
import base64

import pytest
from botocore.exceptions import ClientError

import sigv4
from conftest import ALICE


def code(e):
    return e.value.response["Error"]["Code"]


def raw(server, method, path, headers=None, body=b""):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data.decode(errors="replace")


def signed(server, method, path, body=b"", headers=None, when=None, secret=ALICE[1], payload_hash=None, query=()):
    host = f"127.0.0.1:{server.port}"
    h, sig, amz_date, scope = sigv4.sign(
        method, host, path, list(query), headers or {}, payload_hash or __import__("hashlib").sha256(body).hexdigest(),
        ALICE[0], secret, when or sigv4.now(),
    )
    return h, sig, amz_date, scope


def absent(s3, bucket, key):
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_wrong_secret_and_unknown_key(server, bucket):
    bad = server.client(("AKIAALICE0000000001", "not-the-secret-at-all"))
    with pytest.raises(ClientError) as e:
        bad.put_object(Bucket=bucket, Key="x", Body=b"x")
    assert code(e) == "SignatureDoesNotMatch"
    unknown = server.client(("AKIANOBODY000000000", "whatever-secret-key"))
    with pytest.raises(ClientError) as e:
        unknown.list_buckets()
    assert code(e) == "InvalidAccessKeyId"
    status, body = raw(server, "GET", "/")
    assert status == 403 and "<Code>AccessDenied</Code>" in body


def test_clock_skew(server, bucket):
    h, *_ = signed(server, "GET", f"/{bucket}", when=sigv4.now() - datetime.timedelta(hours=1))
    status, body = raw(server, "GET", f"/{bucket}", h)
    assert status == 403 and "RequestTimeTooSkewed" in body


def test_content_sha256_mismatch(server, s3, bucket):
    h, *_ = signed(server, "PUT", f"/{bucket}/sha", body=b"one body", payload_hash=__import__("hashlib").sha256(b"another").hexdigest())
    status, body = raw(server, "PUT", f"/{bucket}/sha", h, b"one body")
    assert status == 400 and "XAmzContentSHA256Mismatch" in body
    assert absent(s3, bucket, "sha")


def test_signed_chunks_verified_and_tampering_refused(server, s3, bucket):
    data = bytes(range(256)) * 300  # 76,800 bytes: two 64 KiB chunks and a final one
    for key, tamper in [("chunked-ok", None), ("chunked-bad", 1)]:
        headers = {
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)),
        }
        # The body length depends only on the chunk sizes, so it can be signed up front.
        probe = sigv4.chunked_body(data, 65536, "0" * 64, ALICE[1], "20260101T000000Z", "20260101/us-east-1/s3/aws4_request")
        headers["content-length"] = str(len(probe))
        h, seed, amz_date, scope = signed(server, "PUT", f"/{bucket}/{key}", headers=headers, payload_hash="STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
        body = sigv4.chunked_body(data, 65536, seed, ALICE[1], amz_date, scope, tamper_chunk=tamper)
        status, text = raw(server, "PUT", f"/{bucket}/{key}", h, body)
        if tamper is None:
            assert status == 200, text
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        else:
            assert status == 403 and "SignatureDoesNotMatch" in text, text
            assert absent(s3, bucket, key)


def test_wrong_checksum_refused(server, s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="crc", Body=b"data", ChecksumCRC32="AAAAAA==")
    assert code(e) == "BadDigest"
    assert absent(s3, bucket, "crc")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="md5", Body=b"data", ContentMD5=base64.b64encode(b"0" * 16).decode())
    assert code(e) == "BadDigest"
    assert absent(s3, bucket, "md5")


def test_truncated_and_bad_trailer_aws_chunked(server, s3, bucket):
    data = b"z" * 1000
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    full = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\nx-amz-checksum-crc32:" + crc.encode() + b"\r\n\r\n"
    base = {
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    for key, body, want in [
        ("trunc", full[: len(full) // 2], "IncompleteBody"),
        ("badcrc", full.replace(crc.encode(), b"AAAAAA=="), "BadDigest"),
        ("good", full, None),
    ]:
        h, *_ = signed(server, "PUT", f"/{bucket}/{key}", headers=dict(base, **{"content-length": str(len(body))}), payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
        status, text = raw(server, "PUT", f"/{bucket}/{key}", h, body)
        if want is None:
            assert status == 200, text
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        else:
            assert status == 400 and want in text, text
            assert absent(s3, bucket, key)


def test_expired_presigned_urls(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p", Body=b"x")
    host = f"127.0.0.1:{server.port}"
    old = sigv4.now() - datetime.timedelta(hours=2)
    url = sigv4.presign("GET", host, f"/{bucket}/p", ALICE[0], ALICE[1], old, 60)
    status, body = raw(server, "GET", url)
    assert status == 403 and "<Code>AccessDenied</Code>" in body and "expired" in body
    fresh = sigv4.presign("GET", host, f"/{bucket}/p", ALICE[0], ALICE[1], sigv4.now(), 60)
    assert raw(server, "GET", fresh) == (200, "x")
    too_long = sigv4.presign("GET", host, f"/{bucket}/p", ALICE[0], ALICE[1], sigv4.now(), 8 * 24 * 3600)
    status, body = raw(server, "GET", too_long)
    assert status == 403 and "AccessDenied" in body


def test_malformed_xml_and_small_parts(server, s3, bucket):
    for path, doc in [(f"/{bucket}?delete", b"<Delete><Object><Key>a</Key>"), (f"/{bucket}?delete", b"not xml at all")]:
        h, *_ = signed(server, "POST", path.split("?")[0], body=doc, query=[("delete", "")])
        status, body = raw(server, "POST", path, h, doc)
        assert status == 400 and "MalformedXML" in body, body
    up = s3.create_multipart_upload(Bucket=bucket, Key="small")
    uid = up["UploadId"]
    p1 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=1, Body=b"a" * 1024)
    p2 = s3.upload_part(Bucket=bucket, Key="small", UploadId=uid, PartNumber=2, Body=b"b" * 1024)
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": [
            {"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]})
    assert code(e) == "EntityTooSmall"
    assert absent(s3, bucket, "small")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": [
            {"PartNumber": 2, "ETag": p2["ETag"]}, {"PartNumber": 1, "ETag": p1["ETag"]}]})
    assert code(e) == "InvalidPartOrder"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": [
            {"PartNumber": 1, "ETag": '"0000"'}]})
    assert code(e) == "InvalidPart"
    doc = b"<CompleteMultipartUpload><Part><PartNumber>1</Part>"
    q = [("uploadId", uid)]
    h, *_ = signed(server, "POST", f"/{bucket}/small", body=doc, query=q)
    status, body = raw(server, "POST", f"/{bucket}/small?uploadId={uid}", h, doc)
    assert status == 400 and "MalformedXML" in body, body
    assert absent(s3, bucket, "small")
    # The upload is still there and can finish with a single (last, so small) part.
    s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": p1["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="small")["Body"].read() == b"a" * 1024
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket=bucket, Key="small", UploadId=uid)
    assert code(e) == "NoSuchUpload"
