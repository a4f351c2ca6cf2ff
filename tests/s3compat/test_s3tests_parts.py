"""Multipart details from ceph/s3-tests, through the current boto3 at its default settings:
the checksum CompleteMultipartUpload names for the object, part reads (`?partNumber=`),
GetObjectAttributes' ObjectParts, a repeated CompleteMultipartUpload, and conditional
writes and deletes."""

import base64
import datetime
import hashlib
import zlib

import pytest
from botocore.exceptions import ClientError

MIB = 1024 * 1024
PARTS = [b"a" * (5 * MIB), b"b" * (5 * MIB), b"c" * MIB]


def code(e):
    return e.value.response["Error"]["Code"]


def status(e):
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def b64(raw):
    return base64.b64encode(raw).decode()


def sha256(data):
    return b64(hashlib.sha256(data).digest())


def composite_sha256(parts):
    """S3's composite checksum: the SHA-256 of the part SHA-256s, then `-N`."""
    inner = b"".join(hashlib.sha256(p).digest() for p in parts)
    return f"{b64(hashlib.sha256(inner).digest())}-{len(parts)}"


def upload(s3, bucket, key, parts, **create):
    """Starts an upload and sends `parts`; returns its id and the Complete list."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    alg = create.get("ChecksumAlgorithm")
    listed = []
    for n, data in enumerate(parts, 1):
        extra = {"ChecksumAlgorithm": alg} if alg else {}
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=data, **extra)
        listed.append({"PartNumber": n, "ETag": r["ETag"]})
    return uid, listed


def test_complete_checks_and_echoes_the_composite_checksum_it_names(s3, bucket):
    # ceph/s3-tests test_multipart_checksum_sha256, test_multipart_use_cksum_helper_sha256.
    body = b"A" * 1024
    uid, parts = upload(s3, bucket, "c", [body], ChecksumAlgorithm="SHA256")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="c", UploadId=uid, ChecksumSHA256="bad", MultipartUpload={"Parts": parts}
        )
    assert (status(e), code(e)) == (400, "BadDigest")
    # Refused, the upload is still there to complete with the right value.
    want = composite_sha256([body])
    r = s3.complete_multipart_upload(
        Bucket=bucket, Key="c", UploadId=uid, ChecksumSHA256=want, MultipartUpload={"Parts": parts}
    )
    assert r["ChecksumSHA256"] == want
    assert r["ChecksumType"] == "COMPOSITE"
    head = s3.head_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == want and head["ChecksumType"] == "COMPOSITE"
    attrs = s3.get_object_attributes(Bucket=bucket, Key="c", ObjectAttributes=["Checksum"])
    assert attrs["Checksum"]["ChecksumSHA256"] == want
    assert attrs["Checksum"]["ChecksumType"] == "COMPOSITE"


def test_complete_checks_a_full_object_crc(s3, bucket):
    # ceph/s3-tests test_multipart_use_cksum_helper_crc32.
    uid, parts = upload(s3, bucket, "f", PARTS, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
    crc = 0
    for p in PARTS:
        crc = zlib.crc32(p, crc)
    want = b64(crc.to_bytes(4, "big"))
    r = s3.complete_multipart_upload(
        Bucket=bucket, Key="f", UploadId=uid, ChecksumCRC32=want, MultipartUpload={"Parts": parts}
    )
    assert (r["ChecksumCRC32"], r["ChecksumType"]) == (want, "FULL_OBJECT")
    # A part read carries the part's own CRC, of the object's type.
    r = s3.get_object(Bucket=bucket, Key="f", PartNumber=2)
    assert r["ChecksumCRC32"] == b64(zlib.crc32(PARTS[1]).to_bytes(4, "big"))
    assert r["ChecksumType"] == "FULL_OBJECT"


def test_complete_answers_the_computed_checksum_in_its_document(s3, bucket):
    # ceph/s3-tests test_get_multipart_checksum_object_attributes: no part checksums listed,
    # no checksum header, and still the composite comes back.
    uid, parts = upload(s3, bucket, "k", PARTS, ChecksumAlgorithm="SHA256")
    r = s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={"Parts": parts})
    assert r["ChecksumSHA256"] == composite_sha256(PARTS)
    a = s3.get_object_attributes(Bucket=bucket, Key="k", ObjectAttributes=["Checksum", "ObjectParts"])
    assert a["Checksum"]["ChecksumSHA256"] == r["ChecksumSHA256"]
    assert [(p["PartNumber"], p["Size"], p["ChecksumSHA256"]) for p in a["ObjectParts"]["Parts"]] == [
        (n, len(p), sha256(p)) for n, p in enumerate(PARTS, 1)
    ]


def test_complete_refuses_a_checksum_of_another_algorithm(s3, bucket):
    uid, parts = upload(s3, bucket, "o", [b"x" * 10], ChecksumAlgorithm="SHA256")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="o", UploadId=uid, ChecksumCRC32="AAAAAA==", MultipartUpload={"Parts": parts}
        )
    assert (status(e), code(e)) == (400, "InvalidRequest")


def test_part_reads(s3, bucket):
    # ceph/s3-tests test_multipart_get_part, test_multipart_single_get_part.
    uid, parts = upload(s3, bucket, "p", PARTS)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="p", PartNumber=1)
    assert (status(e), code(e)) == (404, "NoSuchKey")
    done = s3.complete_multipart_upload(Bucket=bucket, Key="p", UploadId=uid, MultipartUpload={"Parts": parts})
    offset = 0
    for n, data in enumerate(PARTS, 1):
        head = s3.head_object(Bucket=bucket, Key="p", PartNumber=n)
        assert (head["PartsCount"], head["ETag"], head["ContentLength"]) == (3, done["ETag"], len(data))
        r = s3.get_object(Bucket=bucket, Key="p", PartNumber=n)
        assert (r["PartsCount"], r["ETag"], r["ContentLength"]) == (3, done["ETag"], len(data))
        assert r["ContentRange"] == f"bytes {offset}-{offset + len(data) - 1}/{11 * MIB}"
        assert r["Body"].read() == data
        offset += len(data)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="p", PartNumber=4)
    assert (status(e), code(e)) == (400, "InvalidPart")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="p", PartNumber=1, Range="bytes=0-1")
    assert status(e) == 400


def test_part_reads_of_a_single_part_object(s3, bucket):
    # ceph/s3-tests test_non_multipart_get_part.
    etag = s3.put_object(Bucket=bucket, Key="s", Body=b"body")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="s", PartNumber=2)
    assert (status(e), code(e)) == (400, "InvalidPart")
    r = s3.get_object(Bucket=bucket, Key="s", PartNumber=1)
    assert r["ETag"] == etag and r["Body"].read() == b"body"


def test_object_parts_are_listed_by_page(s3, bucket):
    # ceph/s3-tests test_get_multipart_object_attributes,
    # test_get_paginated_multipart_object_attributes.
    sizes = [5 * MIB] * 4 + [MIB]
    uid, parts = upload(s3, bucket, "m", [bytes([65 + i]) * n for i, n in enumerate(sizes)])
    s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=uid, MultipartUpload={"Parts": parts})
    all_ = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
    a = s3.get_object_attributes(Bucket=bucket, Key="m", ObjectAttributes=all_)["ObjectParts"]
    assert a["TotalPartsCount"] == 5 and a["IsTruncated"] is False
    assert [(p["PartNumber"], p["Size"]) for p in a["Parts"]] == list(enumerate(sizes, 1))
    assert all("ChecksumSHA256" not in p for p in a["Parts"])
    a = s3.get_object_attributes(
        Bucket=bucket, Key="m", ObjectAttributes=all_, MaxParts=1, PartNumberMarker=3
    )["ObjectParts"]
    assert (a["MaxParts"], a["PartNumberMarker"], a["IsTruncated"], a["NextPartNumberMarker"]) == (1, 3, True, 4)
    assert [p["PartNumber"] for p in a["Parts"]] == [4]
    a = s3.get_object_attributes(
        Bucket=bucket, Key="m", ObjectAttributes=all_, MaxParts=10, PartNumberMarker=3
    )["ObjectParts"]
    assert a["IsTruncated"] is False
    assert [(p["PartNumber"], p["Size"]) for p in a["Parts"]] == [(4, 5 * MIB), (5, MIB)]


def test_completing_again_answers_as_the_first_time(s3, bucket):
    # ceph/s3-tests test_multipart_upload, test_multipart_reupload_checksum_and_etag.
    uid, parts = upload(s3, bucket, "r", PARTS, ChecksumAlgorithm="SHA256")
    want = composite_sha256(PARTS)
    first = s3.complete_multipart_upload(
        Bucket=bucket, Key="r", UploadId=uid, ChecksumSHA256=want, MultipartUpload={"Parts": parts}
    )
    again = s3.complete_multipart_upload(
        Bucket=bucket, Key="r", UploadId=uid, ChecksumSHA256=want, MultipartUpload={"Parts": parts}
    )
    assert (again["ETag"], again["ChecksumSHA256"]) == (first["ETag"], first["ChecksumSHA256"])
    # Another part list is not the completed upload's.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="r", UploadId=uid, MultipartUpload={"Parts": parts[:1]})
    assert code(e) == "NoSuchUpload"
    # Nor is the key's object once something else replaced it.
    s3.put_object(Bucket=bucket, Key="r", Body=b"new")
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="r", UploadId=uid, MultipartUpload={"Parts": parts})
    assert code(e) == "NoSuchUpload"


def test_if_match_on_writes(s3, bucket):
    # The If-Match half of ceph/s3-tests test_put_object_if_match and
    # test_multipart_put_object_if_match (If-None-Match with an ETag stays 501, as in S3).
    etag = s3.put_object(Bucket=bucket, Key="w", Body=b"1")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="w", Body=b"2", IfMatch='"badetag"')
    assert (status(e), code(e)) == (412, "PreconditionFailed")
    etag = s3.put_object(Bucket=bucket, Key="w", Body=b"2", IfMatch=etag)["ETag"]
    uid, parts = upload(s3, bucket, "w", [b"abc"])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="w", UploadId=uid, IfMatch='"badetag"', MultipartUpload={"Parts": parts}
        )
    assert (status(e), code(e)) == (412, "PreconditionFailed")
    s3.complete_multipart_upload(Bucket=bucket, Key="w", UploadId=uid, IfMatch=etag, MultipartUpload={"Parts": parts})
    s3.delete_object(Bucket=bucket, Key="w")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="w", Body=b"3", IfMatch="*")
    assert (status(e), code(e)) == (404, "NoSuchKey")


def test_delete_object_conditions(s3, bucket):
    # ceph/s3-tests test_delete_object_if_match, ..._if_match_last_modified_time,
    # ..._if_match_size.
    etag = s3.put_object(Bucket=bucket, Key="d", Body=b"")["ETag"]
    mtime = s3.head_object(Bucket=bucket, Key="d")["LastModified"]
    bad_time = datetime.datetime(2015, 1, 1)
    for cond in [{"IfMatch": "badetag"}, {"IfMatchLastModifiedTime": bad_time}, {"IfMatchSize": 9999}]:
        with pytest.raises(ClientError) as e:
            s3.delete_object(Bucket=bucket, Key="d", **cond)
        assert (status(e), code(e)) == (412, "PreconditionFailed"), cond
    s3.head_object(Bucket=bucket, Key="d")
    s3.delete_object(Bucket=bucket, Key="d", IfMatch=etag, IfMatchLastModifiedTime=mtime, IfMatchSize=0)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="d")
    assert status(e) == 404
    # A missing key: nothing to compare, the delete is a no-op.
    r = s3.delete_object(Bucket=bucket, Key="d", IfMatch="badetag")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_delete_objects_conditions(s3, bucket):
    # ceph/s3-tests test_delete_objects_if_match, ..._if_match_last_modified_time,
    # ..._if_match_size.
    etag = s3.put_object(Bucket=bucket, Key="d", Body=b"")["ETag"]
    mtime = s3.head_object(Bucket=bucket, Key="d")["LastModified"]
    bad_time = datetime.datetime(2015, 1, 1)
    for cond in [{"ETag": "badetag"}, {"LastModifiedTime": bad_time}, {"Size": 9999}]:
        r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d", **cond}]})
        assert [(x["Key"], x["Code"]) for x in r["Errors"]] == [("d", "PreconditionFailed")], cond
        assert "Deleted" not in r
    r = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": "d", "ETag": etag, "LastModifiedTime": mtime, "Size": 0}]}
    )
    assert [x["Key"] for x in r["Deleted"]] == ["d"]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "d", "ETag": "badetag"}]})
    assert "Errors" not in r


def test_bucket_names_with_a_hyphen_next_to_a_dot_are_refused(s3):
    # ceph/s3-tests test_bucket_create_naming_dns_dot_dash, ..._dash_dot.
    for name in ["foo.-bar", "foo-.bar"]:
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket=name)
        assert (status(e), code(e)) == (400, "InvalidBucketName"), name
