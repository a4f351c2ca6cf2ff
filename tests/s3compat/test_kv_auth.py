"""The KV control API under authentication: calls are SigV4-signed like any S3 request (here
with botocore's signer), bucket grants apply, and lease and put ids work only for the user
who got them: another user who learns an id can neither release the lease nor end or revoke
the put."""

import json
import urllib.error
import urllib.request

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import pytest

from conftest import ALICE, BOB, Server

CAROL = ("AKIACAROL000000000003", "carol-secret-key-0000000000000000000000")


@pytest.fixture(scope="module")
def server():
    """The usual two users, plus carol, who may write alice's shared bucket."""
    s = Server(
        extra_config=f"""
[[users]]
name = "carol"
access_key = "{CAROL[0]}"
secret_key = "{CAROL[1]}"
write = ["alice-shared"]
"""
    )
    yield s
    s.stop()


def kv(server, creds, path, body, signed=True):
    """POSTs a JSON body to the node; returns (status, parsed body or text)."""
    url = server.url + path
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if signed:
        req = botocore.awsrequest.AWSRequest(method="POST", url=url, data=data, headers=headers)
        botocore.auth.S3SigV4Auth(
            botocore.credentials.Credentials(*creds), "s3", "us-east-1"
        ).add_auth(req)
        headers = dict(req.headers.items())
    r = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(r, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture
def shared(s3):
    """alice-shared: alice's bucket that bob may read (see conftest)."""
    try:
        s3.create_bucket(Bucket="alice-shared")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    s3.put_object(Bucket="alice-shared", Key="blk", Body=b"kv bytes")
    return "alice-shared"


def test_unsigned_and_wrongly_signed_kv_calls_are_refused(server, shared):
    status, _ = kv(server, ALICE, f"/v1/kv/{shared}/exists", {"keys": ["blk"]}, signed=False)
    assert status == 403
    status, _ = kv(server, (ALICE[0], "wrong"), f"/v1/kv/{shared}/exists", {"keys": ["blk"]})
    assert status == 403
    status, body = kv(server, ALICE, f"/v1/kv/{shared}/exists", {"keys": ["blk", "nope"]})
    assert status == 200 and body["exists"] == [True, False]


def test_grants_apply_to_kv_calls(server, shared):
    # bob may read alice-shared but not write it.
    status, body = kv(server, BOB, f"/v1/kv/{shared}/exists", {"keys": ["blk"]})
    assert status == 200 and body["exists"] == [True]
    status, _ = kv(server, BOB, f"/v1/kv/{shared}/put-start", {"blocks": [{"key": "b", "len": 4}]})
    assert status == 403
    status, _ = kv(server, BOB, f"/v1/kv/{shared}/remove", {"keys": ["blk"]})
    assert status == 403


def test_ids_work_only_for_the_user_who_got_them(server, shared):
    status, got = kv(server, ALICE, f"/v1/kv/{shared}/get", {"keys": ["blk"]})
    assert status == 200, got
    leases = got["leases"]
    assert len(leases) == 1
    # bob learns the lease id: releasing it does nothing.
    status, body = kv(server, BOB, "/v1/kv/release", {"leases": leases})
    assert status == 200 and body["released"] == 0
    status, body = kv(server, ALICE, "/v1/kv/release", {"leases": leases})
    assert status == 200 and body["released"] == 1

    # A put id is alice's alone as well: carol may write the bucket, yet cannot end or revoke
    # alice's put; bob may not write it at all.
    status, started = kv(
        server, ALICE, f"/v1/kv/{shared}/put-start", {"blocks": [{"key": "p", "len": 4}]}
    )
    assert status == 200, started
    ids = [p["put_id"] for p in started["puts"]]
    status, _ = kv(server, BOB, f"/v1/kv/{shared}/put-end", {"put_ids": ids})
    assert status == 403
    status, body = kv(server, CAROL, f"/v1/kv/{shared}/put-end", {"put_ids": ids})
    assert status == 400 and "unknown" in body, body
    status, body = kv(server, CAROL, f"/v1/kv/{shared}/revoke", {"put_ids": ids})
    assert status == 200 and body["revoked"] == [False]
    status, body = kv(server, ALICE, f"/v1/kv/{shared}/revoke", {"put_ids": ids})
    assert status == 200 and body["revoked"] == [True]
