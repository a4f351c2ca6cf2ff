"""Object ownership (ownership controls) through boto3 at default settings: who owns what
another user writes into a bucket, and ACLs switched off by BucketOwnerEnforced."""

import json

import pytest
from botocore.exceptions import ClientError

from conftest import BOB, fresh_bucket


def error(call):
    with pytest.raises(ClientError) as e:
        call()
    r = e.value.response
    return r["ResponseMetadata"]["HTTPStatusCode"], r["Error"]["Code"]


def open_to_everyone(s3, bucket):
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "*",
                       "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}],
    }))


def owner_of(client, bucket, key):
    return client.get_object_acl(Bucket=bucket, Key=key)["Owner"]["ID"]


def ownership(s3, bucket):
    rules = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    return rules[0]["ObjectOwnership"]


def test_a_bucket_without_controls_says_so_and_controls_round_trip(s3, bucket):
    assert error(lambda: s3.get_bucket_ownership_controls(Bucket=bucket)) == (
        404, "OwnershipControlsNotFoundError")
    s3.put_bucket_ownership_controls(
        Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerPreferred"}]})
    assert ownership(s3, bucket) == "BucketOwnerPreferred"
    s3.delete_bucket_ownership_controls(Bucket=bucket)
    assert error(lambda: s3.get_bucket_ownership_controls(Bucket=bucket))[1] == (
        "OwnershipControlsNotFoundError")
    assert error(lambda: s3.put_bucket_ownership_controls(
        Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": "Nobody"}]}))[0] == 400


def test_bucket_owner_enforced_owns_everything_and_turns_acls_off(server, s3):
    b = fresh_bucket(s3, "own", ObjectOwnership="BucketOwnerEnforced")
    assert ownership(s3, b) == "BucketOwnerEnforced"
    open_to_everyone(s3, b)
    bob = server.client(BOB)
    bob.put_object(Bucket=b, Key="plain", Body=b"x")
    bob.put_object(Bucket=b, Key="bofc", Body=b"x", ACL="bucket-owner-full-control")
    assert owner_of(bob, b, "plain") == "alice" and owner_of(bob, b, "bofc") == "alice"
    assert error(lambda: bob.put_object(Bucket=b, Key="p", Body=b"x", ACL="private")) == (
        400, "AccessControlListNotSupported")
    assert error(lambda: bob.put_bucket_acl(Bucket=b, ACL="private")) == (
        400, "AccessControlListNotSupported")
    assert error(lambda: s3.put_object_acl(Bucket=b, Key="plain", ACL="public-read")) == (
        400, "AccessControlListNotSupported")


def test_enforcing_needs_a_private_bucket_acl(s3):
    b = fresh_bucket(s3, "own", ACL="public-read")
    enforce = {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert error(lambda: s3.put_bucket_ownership_controls(Bucket=b, OwnershipControls=enforce)) == (
        400, "InvalidBucketAclWithObjectOwnership")
    s3.put_bucket_acl(Bucket=b, ACL="private")
    s3.put_bucket_ownership_controls(Bucket=b, OwnershipControls=enforce)
    assert ownership(s3, b) == "BucketOwnerEnforced"


def test_bucket_owner_preferred_takes_what_is_written_bucket_owner_full_control(server, s3):
    b = fresh_bucket(s3, "own", ObjectOwnership="BucketOwnerPreferred")
    open_to_everyone(s3, b)
    bob = server.client(BOB)
    bob.put_object(Bucket=b, Key="plain", Body=b"x")
    bob.put_object(Bucket=b, Key="bofc", Body=b"x", ACL="bucket-owner-full-control")
    assert owner_of(bob, b, "plain") == "bob"
    assert owner_of(bob, b, "bofc") == "alice"
    # ACLs still work here.
    bob.put_object_acl(Bucket=b, Key="plain", ACL="private")
