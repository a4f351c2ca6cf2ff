"""CORS through boto3 at default settings (Put/Get/DeleteBucketCors) and through raw HTTP as a
browser sends it: the preflight OPTIONS and the Access-Control-* headers on real requests,
presigned ones included."""

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from conftest import BOB, fresh_bucket


RULES = {
    "CORSRules": [
        {
            "AllowedOrigins": ["http://*.example.com"],
            "AllowedMethods": ["PUT", "POST"],
            "AllowedHeaders": ["content-type", "x-amz-*"],
            "ExposeHeaders": ["ETag"],
            "MaxAgeSeconds": 600,
        },
        {"ID": "reads", "AllowedOrigins": ["*"], "AllowedMethods": ["GET", "HEAD"]},
    ]
}


def code(call):
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]["Code"]


def raw(url, method="GET", headers=None, body=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


def test_cors_configuration_round_trips(server, s3):
    b = fresh_bucket(s3, "cors")
    assert code(lambda: s3.get_bucket_cors(Bucket=b)) == "NoSuchCORSConfiguration"
    s3.put_bucket_cors(Bucket=b, CORSConfiguration=RULES)
    got = s3.get_bucket_cors(Bucket=b)["CORSRules"]
    assert got[0]["AllowedOrigins"] == ["http://*.example.com"]
    assert got[0]["MaxAgeSeconds"] == 600
    assert got[1]["ID"] == "reads"
    # Only the bucket's owner configures it.
    bob = server.client(BOB)
    assert code(lambda: bob.get_bucket_cors(Bucket=b)) == "AccessDenied"
    assert code(lambda: bob.put_bucket_cors(Bucket=b, CORSConfiguration=RULES)) == "AccessDenied"
    # Bad rules are refused and change nothing.
    bad = {"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]}
    assert code(lambda: s3.put_bucket_cors(Bucket=b, CORSConfiguration=bad)) == "InvalidRequest"
    assert len(s3.get_bucket_cors(Bucket=b)["CORSRules"]) == 2
    s3.delete_bucket_cors(Bucket=b)
    assert code(lambda: s3.get_bucket_cors(Bucket=b)) == "NoSuchCORSConfiguration"


def test_preflight_and_headers_on_requests(server, s3):
    b = fresh_bucket(s3, "cors")
    s3.put_object(Bucket=b, Key="k", Body=b"v")
    url = f"{server.url}/{b}/k"
    pre = {
        "Origin": "http://app.example.com",
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "Content-Type, X-Amz-Date",
    }
    # No configuration: every preflight is refused.
    status, _, body = raw(url, "OPTIONS", pre)
    assert status == 403 and b"AccessForbidden" in body
    s3.put_bucket_cors(Bucket=b, CORSConfiguration=RULES)
    status, h, _ = raw(url, "OPTIONS", pre)
    assert status == 200
    assert h["access-control-allow-origin"] == "http://app.example.com"
    assert "PUT" in h["access-control-allow-methods"]
    assert h["access-control-allow-headers"] == "content-type, x-amz-date"
    assert h["access-control-max-age"] == "600"
    assert h["access-control-allow-credentials"] == "true"
    # Another origin, method or header: refused.
    for change in (
        {"Origin": "http://evil.com"},
        {"Access-Control-Request-Method": "DELETE"},
        {"Access-Control-Request-Headers": "authorization"},
    ):
        assert raw(url, "OPTIONS", {**pre, **change})[0] == 403, change
    assert raw(url, "OPTIONS", {"Access-Control-Request-Method": "PUT"})[0] == 400
    # A GET from any origin is allowed by the second rule: `*`, and the bytes.
    status, h, body = raw(url, "GET", {"Origin": "http://elsewhere.org"})
    assert status == 403  # unsigned, private object: refused, but readable by the page
    assert h["access-control-allow-origin"] == "*"
    presigned = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": "k"})
    status, h, body = raw(presigned, "GET", {"Origin": "http://elsewhere.org"})
    assert (status, body) == (200, b"v")
    assert h["access-control-allow-origin"] == "*"
    # A signed PUT from an allowed origin exposes the ETag.
    put = s3.generate_presigned_url(
        "put_object", Params={"Bucket": b, "Key": "up", "ContentType": "text/plain"}
    )
    headers = {"Origin": "http://app.example.com", "Content-Type": "text/plain"}
    status, h, body = raw(put, "PUT", headers, b"uploaded")
    assert status == 200, body
    assert h["access-control-allow-origin"] == "http://app.example.com"
    assert h["access-control-expose-headers"] == "ETag"
    # No Origin, no CORS headers.
    status, h, _ = raw(presigned, "GET")
    assert "access-control-allow-origin" not in h
