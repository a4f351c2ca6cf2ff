"""ACLs and anonymous access through boto3 at default settings, and through curl-like
unsigned requests: what anonymous and another user can and cannot do under each canned ACL."""

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from conftest import BOB, fresh_bucket

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"




def code(call):
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]["Code"]


def curl(server, method, path, body=None):
    """An unsigned request, as curl sends it: (status, body)."""
    req = urllib.request.Request(server.url + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def grants(acl):
    out = set()
    for g in acl["Grants"]:
        who = g["Grantee"].get("URI") or g["Grantee"].get("ID")
        out.add((who, g["Permission"]))
    return out


def test_canned_acls_decide_what_anonymous_may_do(server, s3):
    anon = server.anonymous()
    private = fresh_bucket(s3, "acl")
    public = fresh_bucket(s3, "acl", ACL="public-read")
    open_rw = fresh_bucket(s3, "acl", ACL="public-read-write")
    auth_read = fresh_bucket(s3, "acl", ACL="authenticated-read")
    for b in (private, public, open_rw, auth_read):
        s3.put_object(Bucket=b, Key="private-obj", Body=b"secret")
        s3.put_object(Bucket=b, Key="public-obj", Body=b"hello", ACL="public-read")

    # Listing follows the bucket's READ grant.
    assert code(lambda: anon.list_objects_v2(Bucket=private)) == "AccessDenied"
    assert [o["Key"] for o in anon.list_objects_v2(Bucket=public)["Contents"]] == [
        "private-obj",
        "public-obj",
    ]
    anon.list_objects_v2(Bucket=open_rw)
    assert code(lambda: anon.list_objects_v2(Bucket=auth_read)) == "AccessDenied"
    assert code(lambda: anon.list_buckets()) == "AccessDenied"

    # Reading follows the object's own ACL, whatever the bucket's.
    for b in (private, public, open_rw, auth_read):
        assert anon.get_object(Bucket=b, Key="public-obj")["Body"].read() == b"hello"
        assert code(lambda: anon.get_object(Bucket=b, Key="private-obj")) == "AccessDenied"
        # A key that does not exist is NoSuchKey to whoever may list the bucket (as in S3),
        # and tells anybody else nothing more.
        listable = b in (public, open_rw)
        expected = "NoSuchKey" if listable else "AccessDenied"
        assert code(lambda: anon.get_object(Bucket=b, Key="missing")) == expected
        assert code(lambda: anon.get_bucket_acl(Bucket=b)) == "AccessDenied"
        assert code(lambda: anon.get_object_acl(Bucket=b, Key="public-obj")) == "AccessDenied"

    # Writing follows the bucket's WRITE grant: only public-read-write.
    for b in (private, public, auth_read):
        assert code(lambda: anon.put_object(Bucket=b, Key="x", Body=b"x")) == "AccessDenied"
        assert code(lambda: anon.delete_object(Bucket=b, Key="public-obj")) == "AccessDenied"
    anon.put_object(Bucket=open_rw, Key="dropped", Body=b"from anyone")
    assert s3.get_object(Bucket=open_rw, Key="dropped")["Body"].read() == b"from anyone"
    anon.delete_object(Bucket=open_rw, Key="dropped")
    assert code(lambda: anon.create_bucket(Bucket="anon-made")) == "AccessDenied"
    assert code(lambda: anon.put_bucket_acl(Bucket=open_rw, ACL="private")) == "AccessDenied"

    # The same through curl, unsigned.
    assert curl(server, "GET", f"/{public}/public-obj") == (200, b"hello")
    assert curl(server, "GET", f"/{public}/private-obj")[0] == 403
    assert curl(server, "PUT", f"/{public}/x", b"x")[0] == 403
    assert curl(server, "PUT", f"/{open_rw}/curl", b"by curl")[0] == 200
    assert curl(server, "GET", f"/{public}?list-type=2")[0] == 200
    # The KV API never serves anonymous callers.
    assert curl(server, "POST", f"/v1/kv/{open_rw}/exists", b'{"keys":["curl"]}')[0] == 403


def test_authenticated_read_and_other_users(server, s3):
    bob = server.client(BOB)
    anon = server.anonymous()
    b = fresh_bucket(s3, "acl", ACL="authenticated-read")
    s3.put_object(Bucket=b, Key="for-users", Body=b"u", ACL="authenticated-read")
    s3.put_object(Bucket=b, Key="alices", Body=b"a")
    assert [o["Key"] for o in bob.list_objects_v2(Bucket=b)["Contents"]] == ["alices", "for-users"]
    assert bob.get_object(Bucket=b, Key="for-users")["Body"].read() == b"u"
    assert code(lambda: anon.get_object(Bucket=b, Key="for-users")) == "AccessDenied"
    assert code(lambda: bob.get_object(Bucket=b, Key="alices")) == "AccessDenied"
    assert code(lambda: bob.put_object(Bucket=b, Key="bobs", Body=b"b")) == "AccessDenied"


def test_acls_read_and_change(server, s3):
    anon = server.anonymous()
    b = fresh_bucket(s3, "acl", ACL="public-read")
    acl = s3.get_bucket_acl(Bucket=b)
    assert acl["Owner"]["ID"] == "alice"
    assert grants(acl) == {("alice", "FULL_CONTROL"), (ALL_USERS, "READ")}

    s3.put_bucket_acl(Bucket=b, ACL="private")
    assert grants(s3.get_bucket_acl(Bucket=b)) == {("alice", "FULL_CONTROL")}
    assert code(lambda: anon.list_objects_v2(Bucket=b)) == "AccessDenied"

    # A whole AccessControlPolicy document, as boto3 sends it.
    s3.put_bucket_acl(
        Bucket=b,
        AccessControlPolicy={
            "Owner": {"ID": "alice"},
            "Grants": [
                {"Grantee": {"Type": "Group", "URI": AUTHENTICATED}, "Permission": "READ"},
                {"Grantee": {"Type": "CanonicalUser", "ID": "bob"}, "Permission": "WRITE"},
            ],
        },
    )
    bob = server.client(BOB)
    bob.list_objects_v2(Bucket=b)
    bob.put_object(Bucket=b, Key="bobs", Body=b"b")
    # Listed as written: a document without the owner's grant does not list one (the owner
    # keeps full access anyway).
    assert grants(s3.get_bucket_acl(Bucket=b)) == {
        (AUTHENTICATED, "READ"),
        ("bob", "WRITE"),
    }
    # Grant headers.
    s3.put_bucket_acl(Bucket=b, GrantRead=f'uri="{ALL_USERS}"')
    anon.list_objects_v2(Bucket=b)

    # An object's ACL changes without touching its bytes, ETag or modification time.
    put = s3.put_object(Bucket=b, Key="o", Body=b"object bytes")
    before = s3.head_object(Bucket=b, Key="o")
    assert code(lambda: anon.get_object(Bucket=b, Key="o")) == "AccessDenied"
    s3.put_object_acl(Bucket=b, Key="o", ACL="public-read")
    assert anon.get_object(Bucket=b, Key="o")["Body"].read() == b"object bytes"
    after = s3.head_object(Bucket=b, Key="o")
    assert after["ETag"] == put["ETag"] == before["ETag"]
    assert after["LastModified"] == before["LastModified"]
    assert (ALL_USERS, "READ") in grants(s3.get_object_acl(Bucket=b, Key="o"))
    # The writer owns its object: bob's object's ACL is bob's to read.
    assert s3.get_object_acl(Bucket=b, Key="bobs")["Owner"]["ID"] == "bob"

    # Bad ACLs are refused clearly and change nothing.
    assert code(lambda: s3.put_bucket_acl(Bucket=b, ACL="everyone")) == "InvalidArgument"
    assert code(
        lambda: s3.put_bucket_acl(
            Bucket=b,
            AccessControlPolicy={
                "Owner": {"ID": "alice"},
                "Grants": [{"Grantee": {"Type": "Group", "URI": "http://x/y"}, "Permission": "READ"}],
            },
        )
    ) == "MalformedACLError"
    anon.list_objects_v2(Bucket=b)


def test_expected_bucket_owner_and_owners_in_listings(server, s3):
    b = fresh_bucket(s3, "acl")
    s3.put_object(Bucket=b, Key="k", Body=b"v", ExpectedBucketOwner="alice")
    assert code(lambda: s3.put_object(Bucket=b, Key="k", Body=b"v", ExpectedBucketOwner="bob")) == "AccessDenied"
    assert code(lambda: s3.list_objects_v2(Bucket=b, ExpectedBucketOwner="bob")) == "AccessDenied"
    v1 = s3.list_objects(Bucket=b)["Contents"][0]
    assert v1["Owner"]["ID"] == "alice"
    assert "Owner" not in s3.list_objects_v2(Bucket=b)["Contents"][0]
    assert s3.list_objects_v2(Bucket=b, FetchOwner=True)["Contents"][0]["Owner"]["ID"] == "alice"
    assert s3.list_buckets()["Owner"]["ID"] == "alice"
    assert s3.list_object_versions(Bucket=b)["Versions"][0]["Owner"]["ID"] == "alice"


def test_uploads_and_parts_name_their_initiator(server, s3):
    bob = server.client(BOB)
    b = fresh_bucket(s3, "acl", ACL="public-read-write")
    up = bob.create_multipart_upload(Bucket=b, Key="big")
    bob.upload_part(Bucket=b, Key="big", UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1024)
    listed = s3.list_multipart_uploads(Bucket=b)["Uploads"][0]
    assert listed["Initiator"]["ID"] == "bob" and listed["Owner"]["ID"] == "bob"
    parts = s3.list_parts(Bucket=b, Key="big", UploadId=up["UploadId"])
    assert parts["Initiator"]["ID"] == "bob" and parts["Owner"]["ID"] == "bob"
    bob.abort_multipart_upload(Bucket=b, Key="big", UploadId=up["UploadId"])
