"""Bucket policies, GetBucketPolicyStatus and public access blocks through boto3 at default
settings: a policy opens a bucket to another user or to everyone, a Deny closes what ACLs or
ownership would allow, conditions are honoured, and each public access block setting does
what S3 documents."""

import json

import pytest
from botocore.exceptions import ClientError

from conftest import BOB, fresh_bucket



def error(call):
    with pytest.raises(ClientError) as e:
        call()
    r = e.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def policy(*statements):
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def statement(effect, action, resource, principal="*", **extra):
    return {"Effect": effect, "Principal": principal, "Action": action, "Resource": resource, **extra}


def arn(bucket, key=None):
    return f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")


def test_put_get_delete_a_policy_round_trips_its_text(s3, bucket):
    assert error(lambda: s3.get_bucket_policy(Bucket=bucket)) == (404, "NoSuchBucketPolicy")
    text = policy(statement("Allow", "s3:ListBucket", arn(bucket), {"AWS": "*"}))
    r = s3.put_bucket_policy(Bucket=bucket, Policy=text)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3.get_bucket_policy(Bucket=bucket)["Policy"] == text
    assert s3.delete_bucket_policy(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert error(lambda: s3.get_bucket_policy(Bucket=bucket)) == (404, "NoSuchBucketPolicy")
    # A missing bucket says so.
    assert error(lambda: s3.get_bucket_policy(Bucket="no-such-bucket-p"))[1] == "NoSuchBucket"


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({"Version": "2012-10-17"}),
        # A resource of another bucket.
        policy(statement("Allow", "s3:GetObject", "arn:aws:s3:::someone-else/*")),
        # An unknown effect, an unknown condition operator.
        policy(statement("Maybe", "s3:GetObject", "arn:aws:s3:::B/*")),
        policy(statement("Allow", "s3:GetObject", "arn:aws:s3:::B/*",
                         Condition={"StringSortOf": {"aws:Referer": "x"}})),
        # NotPrincipal with Allow.
        json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "NotPrincipal": {"AWS": "arn:aws:iam:::user/bob"},
             "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::B"}]}),
    ],
)
def test_a_malformed_policy_is_refused(s3, bucket, bad):
    bad = bad.replace("arn:aws:s3:::B", arn(bucket))
    assert error(lambda: s3.put_bucket_policy(Bucket=bucket, Policy=bad)) == (400, "MalformedPolicy")
    assert error(lambda: s3.get_bucket_policy(Bucket=bucket))[1] == "NoSuchBucketPolicy"


def test_a_policy_opens_a_bucket_to_another_user_and_to_everyone(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="public/a", Body=b"a")
    s3.put_object(Bucket=bucket, Key="private/b", Body=b"b")
    bob = server.client(BOB)
    anon = server.anonymous()
    assert error(lambda: bob.list_objects_v2(Bucket=bucket))[0] == 403
    assert error(lambda: anon.get_object(Bucket=bucket, Key="public/a"))[0] == 403
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Allow", "s3:ListBucket", arn(bucket), {"AWS": ["arn:aws:iam:::user/bob"]}),
        statement("Allow", "s3:GetObject", arn(bucket, "public/*")),
    ))
    keys = [o["Key"] for o in bob.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["private/b", "public/a"]
    assert anon.get_object(Bucket=bucket, Key="public/a")["Body"].read() == b"a"
    assert error(lambda: anon.get_object(Bucket=bucket, Key="private/b"))[0] == 403
    assert error(lambda: anon.list_objects_v2(Bucket=bucket))[0] == 403
    # Nothing allows writing.
    assert error(lambda: bob.put_object(Bucket=bucket, Key="public/x", Body=b"x"))[0] == 403


def test_a_deny_wins_over_acls_and_ownership(s3, server, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    s3.put_bucket_acl(Bucket=bucket, ACL="authenticated-read")
    bob = server.client(BOB)
    bob.list_objects_v2(Bucket=bucket)
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Deny", "s3:ListBucket", arn(bucket), {"AWS": "*"}),
    ))
    assert error(lambda: bob.list_objects_v2(Bucket=bucket)) == (403, "AccessDenied")
    # The owner too, but not from managing the policy itself.
    assert error(lambda: s3.list_objects_v2(Bucket=bucket)) == (403, "AccessDenied")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Deny", "*", [arn(bucket), arn(bucket, "*")]),
    ))
    assert error(lambda: s3.get_object(Bucket=bucket, Key="k"))[0] == 403
    s3.delete_bucket_policy(Bucket=bucket)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_conditions_on_the_prefix_and_the_referer(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="docs/a", Body=b"a")
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Allow", "s3:ListBucket", arn(bucket), {"AWS": "*"},
                  Condition={"StringLike": {"s3:prefix": "docs/*"}}),
        statement("Allow", "s3:GetObject", arn(bucket, "*"),
                  Condition={"StringLikeIfExists": {"aws:Referer": "https://example.com/*"}}),
    ))
    bob = server.client(BOB)
    assert len(bob.list_objects_v2(Bucket=bucket, Prefix="docs/")["Contents"]) == 1
    assert error(lambda: bob.list_objects_v2(Bucket=bucket, Prefix="other/"))[0] == 403
    anon = server.anonymous()

    def with_referer(referer):
        def add(request, **_):
            request.headers["Referer"] = referer
        c = server.anonymous()
        c.meta.events.register("before-sign.s3.GetObject", add)
        return c

    assert with_referer("https://example.com/page").get_object(Bucket=bucket, Key="docs/a")
    assert error(lambda: with_referer("https://evil.example/").get_object(
        Bucket=bucket, Key="docs/a"))[0] == 403
    # IfExists: no Referer at all still matches.
    assert anon.get_object(Bucket=bucket, Key="docs/a")["Body"].read() == b"a"


def test_policy_status_follows_the_policy_and_the_acl(s3, bucket):
    status = lambda: s3.get_bucket_policy_status(Bucket=bucket)["PolicyStatus"]["IsPublic"]
    assert status() is False
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Allow", "s3:ListBucket", arn(bucket),
                  Condition={"IpAddress": {"aws:SourceIp": "10.0.0.0/32"}}),
    ))
    assert status() is False
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Allow", "s3:ListBucket", arn(bucket)),
    ))
    assert status() is True
    s3.delete_bucket_policy(Bucket=bucket)
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    assert status() is True


def test_public_access_block_round_trips_and_blocks_public_policies(s3, bucket):
    code = lambda call: error(call)
    assert code(lambda: s3.get_public_access_block(Bucket=bucket)) == (
        404, "NoSuchPublicAccessBlockConfiguration")
    conf = {"BlockPublicAcls": False, "IgnorePublicAcls": False,
            "BlockPublicPolicy": True, "RestrictPublicBuckets": False}
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=conf)
    assert s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"] == conf
    public = policy(statement("Allow", "s3:GetObject", arn(bucket, "*")))
    assert code(lambda: s3.put_bucket_policy(Bucket=bucket, Policy=public))[0] == 403
    named = policy(statement("Allow", "s3:GetObject", arn(bucket, "*"),
                             {"AWS": "arn:aws:iam:::user/bob"}))
    s3.put_bucket_policy(Bucket=bucket, Policy=named)
    r = s3.delete_public_access_block(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert code(lambda: s3.get_public_access_block(Bucket=bucket))[1] == (
        "NoSuchPublicAccessBlockConfiguration")


def test_restrict_public_buckets_closes_a_public_policy_to_anonymous_callers(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="foo", Body=b"bar")
    s3.put_bucket_policy(Bucket=bucket, Policy=policy(
        statement("Allow", "s3:GetObject", arn(bucket, "*"))))
    anon = server.anonymous()
    assert anon.get_object(Bucket=bucket, Key="foo")["Body"].read() == b"bar"
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "RestrictPublicBuckets": True})
    assert error(lambda: anon.get_object(Bucket=bucket, Key="foo"))[0] == 403
    assert s3.get_object(Bucket=bucket, Key="foo")["Body"].read() == b"bar"


def test_block_public_acls_refuses_public_acls(s3, bucket):
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True})
    for acl in ["public-read", "public-read-write", "authenticated-read"]:
        assert error(lambda: s3.put_bucket_acl(Bucket=bucket, ACL=acl))[0] == 403
        assert error(lambda: s3.put_object(Bucket=bucket, Key="o", Body=b"", ACL=acl))[0] == 403
    s3.put_object(Bucket=bucket, Key="o", Body=b"", ACL="private")
    s3.put_bucket_acl(Bucket=bucket, ACL="private")


def test_ignore_public_acls_makes_public_grants_count_for_nothing(server, s3, bucket):
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    s3.put_object(Bucket=bucket, Key="k", Body=b"v", ACL="public-read")
    bob = server.client(BOB)
    bob.list_objects_v2(Bucket=bucket)
    assert bob.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "IgnorePublicAcls": True})
    assert error(lambda: bob.list_objects_v2(Bucket=bucket))[0] == 403
    assert error(lambda: bob.get_object(Bucket=bucket, Key="k"))[0] == 403
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"


def test_a_policy_survives_a_restart(server, s3):
    name = fresh_bucket(s3)
    text = policy(statement("Allow", "s3:ListBucket", arn(name)))
    s3.put_bucket_policy(Bucket=name, Policy=text)
    s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration={
        "IgnorePublicAcls": True})
    server.restart()
    s3 = server.client()
    assert s3.get_bucket_policy(Bucket=name)["Policy"] == text
    conf = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert conf["IgnorePublicAcls"] is True and conf["BlockPublicAcls"] is False
