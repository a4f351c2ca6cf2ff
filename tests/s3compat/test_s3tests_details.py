"""S3 behaviours ceph/s3-tests (test_s3.py, test_headers.py) checks, through boto3 at its
defaults and raw HTTP where boto3 cannot say it: ACLs listed as written (revoke-all, grants
without the owner, groups first), grants to unknown ids and e-mail addresses, presigned URLs
out of their validity, SigV2 dates, a deleted object read by a caller who may list the
bucket, aws-chunked as a Content-Encoding, a part re-sent while its first upload is in
flight, copy-source ranges, and CORS on a bucket that does not exist."""

import email.utils
import hashlib
import http.client
import urllib.error
import urllib.request
import uuid

import pytest
from botocore.exceptions import ClientError

import sigv4
from conftest import ALICE, BOB, fresh_bucket

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
MIB = 1024 * 1024


def error(call):
    """(status, code) of a call that must fail."""
    with pytest.raises(ClientError) as e:
        call()
    r = e.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def fetch(url, method="GET", headers=None, body=None):
    """A plain HTTP request (a browser, curl, a presigned URL): (status, headers, body)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


def listed(acl):
    """The grants of a GetAcl answer, in order: (ID or URI, permission)."""
    return [(g["Grantee"].get("ID") or g["Grantee"].get("URI"), g["Permission"]) for g in acl["Grants"]]


def with_header(client, operation, name, value):
    """Adds a header to every `operation` call of `client`, before it is signed."""

    def add(params, **kwargs):
        params["headers"][name] = value

    client.meta.events.register(f"before-call.s3.{operation}", add)


# 1. ACLs


def test_an_acl_is_listed_as_written(server, s3):
    """test_object_acl_read/_write/...: the owner's grant with another permission is listed
    alone; neither the Owner's ID and DisplayName nor a grantee's DisplayName is needed."""
    b = fresh_bucket(s3, "acl")
    s3.put_object(Bucket=b, Key="o", Body=b"x")
    for permission in ["READ", "WRITE", "READ_ACP", "WRITE_ACP"]:
        s3.put_object_acl(
            Bucket=b,
            Key="o",
            AccessControlPolicy={
                "Owner": {},
                "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": "alice"}, "Permission": permission}],
            },
        )
        acl = s3.get_object_acl(Bucket=b, Key="o")
        assert listed(acl) == [("alice", permission)]
        assert acl["Owner"]["ID"] == "alice"
        # The owner keeps full control whatever the ACL lists.
        assert s3.get_object(Bucket=b, Key="o")["Body"].read() == b"x"
    # A document that gives the owner FULL_CONTROL lists it, groups first.
    s3.put_bucket_acl(
        Bucket=b,
        AccessControlPolicy={
            "Owner": {"ID": "alice"},
            "Grants": [
                {"Grantee": {"Type": "CanonicalUser", "ID": "alice"}, "Permission": "FULL_CONTROL"},
                {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "READ"},
            ],
        },
    )
    assert listed(s3.get_bucket_acl(Bucket=b)) == [(ALL_USERS, "READ"), ("alice", "FULL_CONTROL")]


def test_canned_acls_list_groups_before_the_owner(s3):
    """test_object_acl_canned_bucketownerread reads the bucket owner at Grants[2] of a
    public-read-write bucket, as Ceph RGW lists it."""
    b = fresh_bucket(s3, "acl", ACL="public-read-write")
    assert listed(s3.get_bucket_acl(Bucket=b)) == [
        (ALL_USERS, "READ"),
        (ALL_USERS, "WRITE"),
        ("alice", "FULL_CONTROL"),
    ]


def test_revoke_all(server, s3):
    """test_bucket_acl_revoke_all: an owner and no grants is accepted, listed empty, denies
    everyone else, and the owner can still set it back."""
    b = fresh_bucket(s3, "acl", ACL="public-read")
    s3.put_object(Bucket=b, Key="foo", Body=b"bar")
    before = s3.get_bucket_acl(Bucket=b)
    server.anonymous().list_objects_v2(Bucket=b)
    s3.put_bucket_acl(Bucket=b, AccessControlPolicy={"Owner": before["Owner"], "Grants": []})
    assert s3.get_bucket_acl(Bucket=b)["Grants"] == []
    assert error(lambda: server.anonymous().list_objects_v2(Bucket=b)) == (403, "AccessDenied")
    assert error(lambda: server.client(BOB).list_objects_v2(Bucket=b)) == (403, "AccessDenied")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]] == ["foo"]
    s3.put_bucket_acl(Bucket=b, AccessControlPolicy={"Owner": before["Owner"], "Grants": before["Grants"]})
    assert listed(s3.get_bucket_acl(Bucket=b)) == listed(before)
    server.anonymous().list_objects_v2(Bucket=b)


def test_grant_headers_list_only_what_they_grant(server, s3):
    """test_bucket_header_acl_grants / test_object_header_acl_grants: x-amz-grant-* headers
    set exactly the grants they name, which then let their grantee in."""
    perms = {"read": "READ", "write": "WRITE", "read-acp": "READ_ACP", "write-acp": "WRITE_ACP", "full-control": "FULL_CONTROL"}
    name = f"acl-hdr-{uuid.uuid4().hex[:16]}"
    granting = server.client()
    for header in perms:
        with_header(granting, "CreateBucket", f"x-amz-grant-{header}", "id=bob")
        with_header(granting, "PutObject", f"x-amz-grant-{header}", "id=bob")
    granting.create_bucket(Bucket=name)
    assert sorted(listed(s3.get_bucket_acl(Bucket=name))) == sorted(("bob", p) for p in perms.values())
    granting.put_object(Bucket=name, Key="k", Body=b"v")
    assert sorted(listed(s3.get_object_acl(Bucket=name, Key="k"))) == sorted(("bob", p) for p in perms.values())
    bob = server.client(BOB)
    bob.put_object(Bucket=name, Key="bobs", Body=b"b")
    bob.put_bucket_acl(Bucket=name, ACL="public-read-write")


def test_a_grant_to_an_unknown_id_is_invalid(s3):
    """test_bucket_acl_grant_nonexist_user: 400 InvalidArgument, and nothing changes."""
    b = fresh_bucket(s3, "acl")
    acl = s3.get_bucket_acl(Bucket=b)
    bad = {"Grantee": {"ID": "_foo", "Type": "CanonicalUser"}, "Permission": "FULL_CONTROL"}
    policy = {"Owner": acl["Owner"], "Grants": acl["Grants"] + [bad]}
    assert error(lambda: s3.put_bucket_acl(Bucket=b, AccessControlPolicy=policy)) == (400, "InvalidArgument")
    assert listed(s3.get_bucket_acl(Bucket=b)) == [("alice", "FULL_CONTROL")]
    assert error(lambda: s3.put_object(Bucket=b, Key="k", Body=b"v", GrantRead="id=nobody")) == (400, "InvalidArgument")
    # Users and the owner are known.
    s3.put_object(Bucket=b, Key="k", Body=b"v", GrantRead="id=bob", GrantFullControl="id=alice")


def test_a_grant_by_unknown_email_is_unresolvable(s3):
    """test_bucket_acl_grant_email_not_exist: 400 UnresolvableGrantByEmailAddress."""
    b = fresh_bucket(s3, "acl")
    acl = s3.get_bucket_acl(Bucket=b)
    by_email = {
        "Grantee": {"EmailAddress": "doesnotexist@dreamhost.com.invalid", "Type": "AmazonCustomerByEmail"},
        "Permission": "FULL_CONTROL",
    }
    policy = {"Owner": acl["Owner"], "Grants": acl["Grants"] + [by_email]}
    assert error(lambda: s3.put_bucket_acl(Bucket=b, AccessControlPolicy=policy)) == (
        400,
        "UnresolvableGrantByEmailAddress",
    )


def test_a_grant_by_email_is_refused_as_unresolvable_not_malformed(s3):
    b = fresh_bucket(s3, "acl")
    by_email = {"Grantee": {"EmailAddress": "x@example.com", "Type": "AmazonCustomerByEmail"}, "Permission": "READ"}
    with pytest.raises(ClientError) as e:
        s3.put_bucket_acl(Bucket=b, AccessControlPolicy={"Owner": {"ID": "alice"}, "Grants": [by_email]})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "x@example.com" in e.value.response["Error"]["Message"]
    assert listed(s3.get_bucket_acl(Bucket=b)) == [("alice", "FULL_CONTROL")]


# 2. Presigned URLs and SigV2 dates


@pytest.mark.parametrize("signature", [None, "s3v4"], ids=["boto3-default", "s3v4"])
def test_presigned_urls_out_of_their_validity_are_access_denied(server, signature):
    """test_object_raw_get_x_amz_expires_out_range_zero/_out_max_range/_out_positive_range,
    test_object_raw_put_authenticated_expired: 403, whichever signature boto3 presigns with."""
    s3 = server.client(**({"signature_version": signature} if signature else {}))
    b = fresh_bucket(s3, "pre", ACL="public-read")
    s3.put_object(Bucket=b, Key="foo", Body=b"bar", ACL="public-read")
    ok = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "foo"}, ExpiresIn=100)
    assert fetch(ok)[0] == 200
    for expires in [0, 609901, -7]:
        url = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "foo"}, ExpiresIn=expires)
        status, _, body = fetch(url)
        assert (status, b"<Code>AccessDenied</Code>" in body) == (403, True), (expires, body)
    url = s3.generate_presigned_url("put_object", Params={"Bucket": b, "Key": "foo"}, ExpiresIn=-1000, HttpMethod="PUT")
    assert fetch(url, "PUT", body=b"foo")[0] == 403
    assert s3.get_object(Bucket=b, Key="foo")["Body"].read() == b"bar"


def test_sigv2_dates(server):
    """test_headers.py *_bad_date_*_aws2: a date far off is RequestTimeTooSkewed even when its
    weekday is wrong (7 July 2010 was a Wednesday); one before 1970 or no date is
    AccessDenied; a good x-amz-date signs as botocore signs it (its Date line kept)."""
    v2 = server.client(signature_version="s3")
    b = fresh_bucket(v2, "v2")
    cases = [
        ("Tue, 07 Jul 2010 21:53:04 GMT", (403, "RequestTimeTooSkewed")),
        ("Tue, 07 Jul 2030 21:53:04 GMT", (403, "RequestTimeTooSkewed")),
        ("Tue, 07 Jul 9999 21:53:04 GMT", (403, "RequestTimeTooSkewed")),
        ("Tue, 07 Jul 1950 21:53:04 GMT", (403, "AccessDenied")),
        ("Bad Date", (403, "AccessDenied")),
        ("", (403, "AccessDenied")),
    ]
    for date, want in cases:
        client = server.client(signature_version="s3")
        with_header(client, "PutObject", "x-amz-date", date)
        assert error(lambda: client.put_object(Bucket=b, Key="k", Body=b"bar")) == want, date
    client = server.client(signature_version="s3")
    with_header(client, "PutObject", "x-amz-date", email.utils.formatdate(usegmt=True))
    client.put_object(Bucket=b, Key="k", Body=b"bar")
    assert v2.get_object(Bucket=b, Key="k")["Body"].read() == b"bar"


# 3. A deleted object


def test_a_deleted_object_is_no_such_key_to_whoever_may_list(server, s3):
    """test_object_raw_get_object_gone (and test_cors_origin_response's GET of a missing key):
    404 NoSuchKey to a caller the bucket lets list it, AccessDenied to any other."""
    anon = server.anonymous()
    public = fresh_bucket(s3, "gone", ACL="public-read")
    private = fresh_bucket(s3, "gone")
    for b in (public, private):
        s3.put_object(Bucket=b, Key="foo", Body=b"x", ACL="public-read")
        assert anon.get_object(Bucket=b, Key="foo")["Body"].read() == b"x"
        s3.delete_object(Bucket=b, Key="foo")
    assert error(lambda: anon.get_object(Bucket=public, Key="foo")) == (404, "NoSuchKey")
    assert error(lambda: anon.head_object(Bucket=public, Key="foo"))[0] == 404
    assert error(lambda: s3.get_object(Bucket=public, Key="foo")) == (404, "NoSuchKey")
    assert error(lambda: anon.get_object(Bucket=private, Key="foo")) == (403, "AccessDenied")
    assert error(lambda: server.client(BOB).get_object(Bucket=private, Key="foo")) == (403, "AccessDenied")


# 4. aws-chunked as a Content-Encoding


def test_aws_chunked_named_on_a_whole_body_is_no_encoding(s3, bucket):
    """test_object_content_encoding_aws_chunked: boto3 sends the body whole, with its hash;
    the object is stored with no Content-Encoding."""
    s3.put_object(Bucket=bucket, Key="encoding", ContentEncoding="gzip")
    assert s3.head_object(Bucket=bucket, Key="encoding")["ContentEncoding"] == "gzip"
    for encoding in ["aws-chunked", "aws-chunked, aws-chunked"]:
        s3.put_object(Bucket=bucket, Key="encoding", ContentEncoding=encoding)
        assert "ContentEncoding" not in s3.head_object(Bucket=bucket, Key="encoding")


def test_aws_chunked_framing_is_stripped_from_the_encoding(server, s3, bucket):
    """A signed streaming PUT naming only `aws-chunked` (mixed case) stores no
    Content-Encoding; `aws-chunked,gzip` stores gzip."""
    data = b"framed " * 5000
    for encoding, stored in [("AWS-Chunked", None), ("aws-chunked, gzip", "gzip")]:
        headers = {"content-encoding": encoding, "x-amz-decoded-content-length": str(len(data))}
        probe = sigv4.chunked_body(data, 8192, "0" * 64, ALICE[1], "20260101T000000Z", "20260101/us-east-1/s3/aws4_request")
        headers["content-length"] = str(len(probe))
        h, seed, amz_date, scope = sigv4.sign(
            "PUT", f"127.0.0.1:{server.port}", f"/{bucket}/c", [], headers,
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", ALICE[0], ALICE[1], sigv4.now(),
        )
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("PUT", f"/{bucket}/c", body=sigv4.chunked_body(data, 8192, seed, ALICE[1], amz_date, scope), headers=h)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        conn.close()
        got = s3.get_object(Bucket=bucket, Key="c")
        assert got.get("ContentEncoding") == stored, encoding
        assert got["Body"].read() == data


# 5. A part re-sent while its first upload is in flight


def test_a_part_resent_while_the_first_is_in_flight(server, s3, bucket):
    """test_multipart_resend_first_finishes_last: part 1 (A) is being sent when the client
    sends it again (B), which is stored first; A then finishes last and is the part. The
    client lists both answers in the order they came; the upload completes from the last
    one, A."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key="re")["UploadId"]
    a, b = b"A" * (1 * MIB), b"B" * (1 * MIB)
    path = f"/{bucket}/re"
    query = [("partNumber", "1"), ("uploadId", uid)]
    h, *_ = sigv4.sign(
        "PUT", f"127.0.0.1:{server.port}", path, query, {"content-length": str(len(a))},
        hashlib.sha256(a).hexdigest(), ALICE[0], ALICE[1], sigv4.now(),
    )
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("PUT", f"{path}?{sigv4.canonical_query(query)}", skip_host=True, skip_accept_encoding=True)
    for k, v in h.items():
        conn.putheader(k, v)
    conn.endheaders()
    conn.send(a[: len(a) // 2])
    # A cannot be stored before the rest of its body arrives: B is stored first.
    etag_b = s3.upload_part(Bucket=bucket, Key="re", UploadId=uid, PartNumber=1, Body=b)["ETag"]
    conn.send(a[len(a) // 2 :])
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    etag_a = r.getheader("etag")
    conn.close()
    assert etag_a == '"%s"' % hashlib.md5(a).hexdigest() and etag_a != etag_b
    assert [p["ETag"] for p in s3.list_parts(Bucket=bucket, Key="re", UploadId=uid)["Parts"]] == [etag_a]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="re", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag_b}, {"PartNumber": 1, "ETag": etag_a}]},
    )
    assert done["ETag"].endswith('-1"')
    assert s3.get_object(Bucket=bucket, Key="re")["Body"].read() == a


def test_a_part_listed_twice_is_checked_by_its_last_entry(s3, bucket):
    """The last entry of a part listed twice names the part held; an earlier one does not
    count, and a number coming back after a higher one is still out of order."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key="twice")["UploadId"]
    first = s3.upload_part(Bucket=bucket, Key="twice", UploadId=uid, PartNumber=1, Body=b"1" * (5 * MIB))["ETag"]
    second = s3.upload_part(Bucket=bucket, Key="twice", UploadId=uid, PartNumber=2, Body=b"2")["ETag"]

    def complete(parts):
        return s3.complete_multipart_upload(
            Bucket=bucket, Key="twice", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]},
        )

    assert error(lambda: complete([(1, first), (1, second), (2, second)])) == (400, "InvalidPart")
    assert error(lambda: complete([(1, first), (2, second), (1, first)])) == (400, "InvalidPartOrder")
    complete([(1, second), (1, first), (2, second), (2, second)])
    assert s3.get_object(Bucket=bucket, Key="twice")["Body"].read() == b"1" * (5 * MIB) + b"2"


# 6. Copy-source ranges


def test_copy_source_ranges(s3, bucket):
    """test_multipart_copy_invalid_range: past the source, InvalidRange (400 or 416);
    test_multipart_copy_improper_range: not `bytes=first-last`, 400 InvalidArgument."""
    s3.put_object(Bucket=bucket, Key="source", Body=b"12345")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dest")["UploadId"]

    def copy(rng):
        return s3.upload_part_copy(
            Bucket=bucket, Key="dest", UploadId=uid, PartNumber=1,
            CopySource={"Bucket": bucket, "Key": "source"}, CopySourceRange=rng,
        )

    for rng in ["bytes=0-21", "bytes=5-6", "bytes=4-5"]:
        status, c = error(lambda: copy(rng))
        assert status in (400, 416) and c == "InvalidRange", rng
    for rng in ["0-2", "bytes=0", "bytes=hello-world", "bytes=0-bar", "bytes=hello-", "bytes=0-2,3-5", "bytes=2-", "bytes=-2", "bytes=3-1"]:
        assert error(lambda: copy(rng)) == (400, "InvalidArgument"), rng
    etag = copy("bytes=1-3")["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="dest", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]}
    )
    assert s3.get_object(Bucket=bucket, Key="dest")["Body"].read() == b"234"


# 7. CORS on a bucket that does not exist


def test_cors_on_a_missing_bucket_is_no_such_bucket(server, s3):
    missing = f"{fresh_bucket(s3, 'cors')}-not-there"
    rules = {"CORSRules": [{"AllowedMethods": ["GET"], "AllowedOrigins": ["*"]}]}
    assert error(lambda: s3.get_bucket_cors(Bucket=missing)) == (404, "NoSuchBucket")
    assert error(lambda: s3.put_bucket_cors(Bucket=missing, CORSConfiguration=rules)) == (404, "NoSuchBucket")
    assert error(lambda: s3.delete_bucket_cors(Bucket=missing)) == (404, "NoSuchBucket")
    # A body that is no configuration does not hide that the bucket is missing.
    h, *_ = sigv4.sign(
        "PUT", f"127.0.0.1:{server.port}", f"/{missing}", [("cors", "")], {}, sigv4.EMPTY_SHA256,
        ALICE[0], ALICE[1], sigv4.now(),
    )
    status, _, body = fetch(f"{server.url}/{missing}?cors=", "PUT", headers=h, body=b"")
    assert status == 404 and b"<Code>NoSuchBucket</Code>" in body, body
    # The preflight too, whatever it asks.
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
    for path in [f"/{missing}", f"/{missing}/key"]:
        status, headers, body = fetch(server.url + path, "OPTIONS", headers=pre)
        assert status == 404 and b"<Code>NoSuchBucket</Code>" in body, body
        assert "Access-Control-Allow-Origin" not in headers
    # An existing bucket without rules still refuses the preflight as before.
    there = fresh_bucket(s3, "cors")
    assert fetch(f"{server.url}/{there}", "OPTIONS", headers=pre)[0] == 403


def test_list_buckets_pages_by_max_buckets(server):
    """test_list_buckets_paginated: MaxBuckets and ContinuationToken, buckets by name."""
    s3 = server.client(BOB)
    mine = sorted(b["Name"] for b in s3.list_buckets()["Buckets"])
    names = [fresh_bucket(s3, "pg") for _ in range(3)]
    everything = sorted(mine + names)
    seen, token = [], None
    while True:
        kw = {"MaxBuckets": 1} if token is None else {"MaxBuckets": 1, "ContinuationToken": token}
        page = s3.list_buckets(**kw)
        assert len(page["Buckets"]) == 1
        seen.append(page["Buckets"][0]["Name"])
        token = page.get("ContinuationToken")
        if token is None:
            break
    assert seen == everything
    assert [b["Name"] for b in s3.list_buckets(Prefix="pg")["Buckets"]] == sorted(names)
    with pytest.raises(ClientError):
        s3.list_buckets(MaxBuckets=1, ContinuationToken="not-a-token")
