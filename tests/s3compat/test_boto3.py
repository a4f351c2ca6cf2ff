"""The current boto3, at its default settings, against Yutu."""

import datetime
import hashlib
import io
import os
import socket
from unittest import mock

import boto3
import botocore.httpchecksum
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from conftest import BOB


def code(e):
    return e.value.response["Error"]["Code"]


def status(e):
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_bucket_crud(s3):
    s3.create_bucket(Bucket="crud-bucket")
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert "crud-bucket" in names
    s3.head_bucket(Bucket="crud-bucket")
    assert s3.get_bucket_location(Bucket="crud-bucket")["LocationConstraint"] in (None, "")
    # Creating it again succeeds, as S3 answers in us-east-1 (--bucket-exists-conflict: 409).
    s3.create_bucket(Bucket="crud-bucket")
    s3.put_object(Bucket="crud-bucket", Key="k", Body=b"v")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket="crud-bucket")
    assert code(e) == "BucketNotEmpty"
    s3.delete_object(Bucket="crud-bucket", Key="k")
    s3.delete_bucket(Bucket="crud-bucket")
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket="crud-bucket")
    assert status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="Bad_Name")
    assert code(e) == "InvalidBucketName"


def test_object_crud_metadata_and_default_checksums(s3, bucket):
    body = os.urandom(100_000)
    put = s3.put_object(
        Bucket=bucket,
        Key="dir/obj.bin",
        Body=body,
        ContentType="application/x-test",
        ContentDisposition='attachment; filename="obj.bin"',
        CacheControl="max-age=60",
        Expires=datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc),
        Metadata={"owner": "alice", "purpose": "compat"},
    )
    assert put["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    # boto3 sends a CRC32 by default; the server verified it and hands it back.
    assert "ChecksumCRC32" in put
    got = s3.get_object(Bucket=bucket, Key="dir/obj.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got["ContentType"] == "application/x-test"
    assert got["ContentDisposition"] == 'attachment; filename="obj.bin"'
    assert got["CacheControl"] == "max-age=60"
    assert got["Expires"].year == 2030
    assert got["Metadata"] == {"owner": "alice", "purpose": "compat"}
    assert got["ChecksumCRC32"] == put["ChecksumCRC32"]
    head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == put["ETag"]
    s3.delete_object(Bucket=bucket, Key="dir/obj.bin")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert code(e) == "NoSuchKey"


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA1", "SHA256"])
def test_explicit_checksum_algorithms(s3, bucket, algorithm):
    body = b"checksummed " * 1000
    put = s3.put_object(Bucket=bucket, Key=f"c-{algorithm}", Body=body, ChecksumAlgorithm=algorithm)
    got = s3.get_object(Bucket=bucket, Key=f"c-{algorithm}", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got[f"Checksum{algorithm}"] == put[f"Checksum{algorithm}"]
    # Never a whole-object checksum on a ranged read.
    ranged = s3.get_object(Bucket=bucket, Key=f"c-{algorithm}", Range="bytes=0-9", ChecksumMode="ENABLED")
    assert ranged["Body"].read() == body[:10]
    assert f"Checksum{algorithm}" not in ranged


def test_streaming_upload_takes_the_aws_chunked_path(s3, bucket):
    """botocore frames uploads as aws-chunked with a CRC32 trailer only over TLS; make it
    believe the endpoint is TLS so that its real encoder talks to Yutu."""
    real = botocore.httpchecksum.urlparse
    seen = {}

    def as_https(url):
        return real(url)._replace(scheme="https")

    body = os.urandom(3 * 1024 * 1024 + 17)

    def capture(request, **kwargs):
        text = lambda v: v.decode() if isinstance(v, bytes) else v
        seen["content-encoding"] = text(request.headers.get("Content-Encoding"))
        seen["sha"] = text(request.headers.get("X-Amz-Content-SHA256"))

    s3.meta.events.register("before-send.s3.PutObject", capture)
    try:
        with mock.patch.object(botocore.httpchecksum, "urlparse", as_https):
            put = s3.put_object(Bucket=bucket, Key="streamed", Body=io.BytesIO(body))
    finally:
        s3.meta.events.unregister("before-send.s3.PutObject", capture)
    assert seen["content-encoding"] == "aws-chunked", seen
    assert seen["sha"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER", seen
    got = s3.get_object(Bucket=bucket, Key="streamed", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got["ChecksumCRC32"] == put["ChecksumCRC32"]
    # aws-chunked is the framing, not the object's encoding.
    assert "ContentEncoding" not in got or got["ContentEncoding"] in ("", None)


def test_listing_pagination_and_delimiters(s3, bucket):
    keys = [f"logs/2026/{i:04d}.log" for i in range(1234)] + [f"top-{i}" for i in range(5)] + ["img/a.png", "img/b.png"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    paginator = s3.get_paginator("list_objects_v2")
    listed = [o["Key"] for page in paginator.paginate(Bucket=bucket, PaginationConfig={"PageSize": 100}) for o in page.get("Contents", [])]
    assert listed == sorted(keys)
    page = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["img/", "logs/"]
    assert [o["Key"] for o in page["Contents"]] == [f"top-{i}" for i in range(5)]
    page = s3.list_objects_v2(Bucket=bucket, Prefix="logs/", Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["logs/2026/"]
    # v1 with markers, through boto3's paginator.
    v1 = [o["Key"] for p in s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 250}) for o in p.get("Contents", [])]
    assert v1 == sorted(keys)
    versions = s3.list_object_versions(Bucket=bucket, Prefix="img/")
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in versions["Versions"]] == [("img/a.png", "null", True), ("img/b.png", "null", True)]


def test_range_reads(s3, bucket):
    body = bytes(range(256)) * 40
    s3.put_object(Bucket=bucket, Key="r", Body=body)
    for rng, want in [("bytes=0-9", body[:10]), ("bytes=100-", body[100:]), ("bytes=-7", body[-7:])]:
        got = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert got["Body"].read() == want
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range=f"bytes={len(body)}-")
    assert code(e) == "InvalidRange"


def test_multipart_64mib_via_transfer_manager(s3, bucket, tmp_path):
    src = tmp_path / "big.bin"
    data = os.urandom(64 * 1024 * 1024)
    src.write_bytes(data)
    s3.upload_file(str(src), bucket, "big.bin")  # default TransferConfig: 8 MiB parts
    head = s3.head_object(Bucket=bucket, Key="big.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-8")
    dst = tmp_path / "back.bin"
    s3.download_file(bucket, "big.bin", str(dst), Config=TransferConfig(max_concurrency=4))
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()
    # Parts are gone once completed.
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_multipart_low_level_copy_list_abort(s3, bucket):
    part = os.urandom(5 * 1024 * 1024)
    s3.put_object(Bucket=bucket, Key="src", Body=part)
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp", ContentType="text/x-mp")
    uid = up["UploadId"]
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]
    p1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=1, Body=part)
    p2 = s3.upload_part_copy(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=2, CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=0-99")
    parts = s3.list_parts(Bucket=bucket, Key="mp", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(part)), (2, 100)]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]}]},
    )
    md5s = hashlib.md5(hashlib.md5(part).digest() + hashlib.md5(part[:100]).digest()).hexdigest()
    assert done["ETag"] == f'"{md5s}-2"'
    got = s3.get_object(Bucket=bucket, Key="mp")
    assert got["Body"].read() == part + part[:100]
    assert got["ContentType"] == "text/x-mp"
    # Abort frees an upload; its id is gone afterwards.
    uid2 = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="gone", UploadId=uid2, PartNumber=1, Body=b"x")
    s3.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=uid2)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="gone", UploadId=uid2)
    assert code(e) == "NoSuchUpload"


def test_copy_object_with_metadata_directive(s3, bucket):
    s3.put_object(Bucket=bucket, Key="orig", Body=b"payload", ContentType="text/plain", Metadata={"a": "1"})
    c = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "orig"})
    assert c["CopyObjectResult"]["ETag"] == '"%s"' % hashlib.md5(b"payload").hexdigest()
    got = s3.get_object(Bucket=bucket, Key="copy")
    assert (got["Body"].read(), got["ContentType"], got["Metadata"]) == (b"payload", "text/plain", {"a": "1"})
    s3.copy_object(Bucket=bucket, Key="copy2", CopySource=f"{bucket}/orig", MetadataDirective="REPLACE", ContentType="text/csv", Metadata={"b": "2"})
    got = s3.head_object(Bucket=bucket, Key="copy2")
    assert (got["ContentType"], got["Metadata"]) == ("text/csv", {"b": "2"})
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="orig", CopySource=f"{bucket}/orig")
    assert code(e) == "InvalidRequest"
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="x", CopySource=f"{bucket}/orig", CopySourceIfMatch='"nope"')
    assert code(e) == "PreconditionFailed"


def test_conditional_requests(s3, bucket):
    put = s3.put_object(Bucket=bucket, Key="c", Body=b"v1")
    etag = put["ETag"]
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"v1"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"other"')
    assert status(e) == 412
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert status(e) == 304
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    earlier = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="c", IfModifiedSince=later)
    assert status(e) == 304
    assert s3.head_object(Bucket=bucket, Key="c", IfModifiedSince=earlier)["ETag"] == etag
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=earlier)
    assert status(e) == 412
    # Conditional writes.
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="c", Body=b"v2", IfNoneMatch="*")
    assert status(e) == 412
    s3.put_object(Bucket=bucket, Key="new", Body=b"n", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="c", Body=b"v2", IfMatch='"stale"')
    assert status(e) == 412
    s3.put_object(Bucket=bucket, Key="c", Body=b"v2", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == b"v2"


def test_delete_objects_1000_keys(s3, bucket):
    keys = [f"d/{i:04d}" for i in range(1000)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    assert sorted(d["Key"] for d in r["Deleted"]) == keys
    assert r.get("Errors", []) == []
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    s3.put_object(Bucket=bucket, Key="q", Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "q"}, {"Key": "k" * 1100}], "Quiet": True})
    assert r.get("Deleted", []) == []
    assert [(e["Key"][:3], e["Code"]) for e in r["Errors"]] == [("kkk", "KeyTooLongError")]


def test_presigned_get_and_put(server, s3, bucket):
    import urllib.request

    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "pre"}, ExpiresIn=300)
    # urllib would add a form Content-Type that the URL was not signed with.
    req = urllib.request.Request(put_url, data=b"presigned body", method="PUT", headers={"Content-Type": ""})
    assert urllib.request.urlopen(req).status == 200
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pre"}, ExpiresIn=300)
    assert urllib.request.urlopen(get_url).read() == b"presigned body"
    # boto3 presigns with SigV2 by default; SigV4 presigned URLs work as well.
    v4 = server.client(signature_version="s3v4")
    v4_url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pre"}, ExpiresIn=300)
    assert "X-Amz-Signature=" in v4_url
    assert urllib.request.urlopen(v4_url).read() == b"presigned body"
    # A tampered presigned URL is refused.
    bad = get_url.replace("pre?", "prx?")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad)
    assert e.value.code == 403


def test_bucket_calls_signed_with_sigv2(server, s3, bucket):
    """botocore's SigV2 signs `/bucket/` for calls it sends to `/bucket`: header-signed listings
    and its default presigned list URL (with `encoding-type=url`) are accepted, another user's
    signature is not."""
    import urllib.request

    s3.put_object(Bucket=bucket, Key="v2 key", Body=b"v2")
    v2 = server.client(signature_version="s3")
    for listing in (v2.list_objects, v2.list_objects_v2):
        keys = [o["Key"] for o in listing(Bucket=bucket, Prefix="v2").get("Contents", [])]
        assert keys == ["v2 key"]
    url = s3.generate_presigned_url("list_objects", Params={"Bucket": bucket}, ExpiresIn=300)
    assert "AWSAccessKeyId=" in url and "encoding-type=url" in url
    assert b"<Key>v2" in urllib.request.urlopen(url).read()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url.replace("Signature=", "Signature=A"))
    assert e.value.code == 403
    v2.create_bucket(Bucket=bucket + "-v2")
    v2.delete_bucket(Bucket=bucket + "-v2")


def test_users_own_their_buckets(server, s3):
    bob = server.client(BOB)
    s3.create_bucket(Bucket="alice-private")
    s3.put_object(Bucket="alice-private", Key="k", Body=b"secret")
    with pytest.raises(ClientError) as e:
        bob.get_object(Bucket="alice-private", Key="k")
    assert code(e) == "AccessDenied"
    assert "alice-private" not in [b["Name"] for b in bob.list_buckets()["Buckets"]]
    # A read grant lets bob read, not write.
    s3.create_bucket(Bucket="alice-shared")
    s3.put_object(Bucket="alice-shared", Key="k", Body=b"shared")
    assert bob.get_object(Bucket="alice-shared", Key="k")["Body"].read() == b"shared"
    with pytest.raises(ClientError) as e:
        bob.put_object(Bucket="alice-shared", Key="k", Body=b"overwrite")
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        bob.delete_bucket(Bucket="alice-shared")
    assert code(e) == "AccessDenied"
    # Presigned URLs carry the signer's rights, no more: bob's (SigV2 and SigV4) reach neither
    # alice's private bucket nor a write into her shared one.
    import urllib.request

    bob_v4 = server.client(BOB, signature_version="s3v4")
    for signer in (bob, bob_v4):
        for method, params in (
            ("get_object", {"Bucket": "alice-private", "Key": "k"}),
            ("list_objects", {"Bucket": "alice-private"}),
        ):
            url = signer.generate_presigned_url(method, Params=params, ExpiresIn=60)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url)
            assert e.value.code == 403, (method, url)
        url = signer.generate_presigned_url(
            "put_object", Params={"Bucket": "alice-shared", "Key": "k"}, ExpiresIn=60
        )
        req = urllib.request.Request(url, data=b"overwrite", method="PUT", headers={"Content-Type": ""})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 403
    assert s3.get_object(Bucket="alice-shared", Key="k")["Body"].read() == b"shared"


def test_virtual_host_addressing(server, bucket):
    """bucket.localhost:PORT names the bucket; resolve *.localhost to loopback for the test."""
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    with mock.patch.object(socket, "getaddrinfo", resolve):
        vs3 = server.client(endpoint_url=f"http://localhost:{server.port}", s3={"addressing_style": "virtual"})
        seen = []
        vs3.meta.events.register("before-send.s3.*", lambda request, **kw: seen.append(request.url))
        vs3.put_object(Bucket=bucket, Key="vh/key", Body=b"virtual")
        assert vs3.get_object(Bucket=bucket, Key="vh/key")["Body"].read() == b"virtual"
        assert [o["Key"] for o in vs3.list_objects_v2(Bucket=bucket, Prefix="vh/")["Contents"]] == ["vh/key"]
    assert seen and all(u.startswith(f"http://{bucket}.localhost:") for u in seen), seen
