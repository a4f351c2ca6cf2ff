"""A small SigV4 signer written from the AWS documentation, independent of the server's, for
raw requests the SDKs will not send (skewed clocks, expired URLs, signed aws-chunked bodies)."""

import datetime
import hashlib
import hmac
import urllib.parse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret, date, region="us-east-1"):
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, "s3")
    return _hmac(k, "aws4_request")


def _quote(s, safe="-_.~"):
    return urllib.parse.quote(s, safe=safe)


def canonical_query(pairs):
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(pairs))


def sign(method, host, path, query_pairs, headers, payload_hash, access, secret, when):
    """Returns the headers to send (with Authorization) and the seed signature."""
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    headers = {k.lower(): v for k, v in headers.items()}
    headers.update({"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash})
    signed = sorted(headers)
    canon_headers = "".join(f"{k}:{' '.join(str(headers[k]).split())}\n" for k in signed)
    creq = "\n".join([method, path, canonical_query(query_pairs), canon_headers, ";".join(signed), payload_hash])
    scope = f"{date}/us-east-1/s3/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    sig = hmac.new(signing_key(secret, date), sts.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={';'.join(signed)}, Signature={sig}"
    return headers, sig, amz_date, scope


def presign(method, host, path, access, secret, when, expires):
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    q = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", f"{access}/{scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    creq = "\n".join([method, path, canonical_query(q), f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    sig = hmac.new(signing_key(secret, amz_date[:8]), sts.encode(), hashlib.sha256).hexdigest()
    return f"{path}?{canonical_query(q)}&X-Amz-Signature={sig}"


def chunked_body(data, chunk_size, seed, secret, amz_date, scope, tamper_chunk=None):
    """aws-chunked framing with chained chunk signatures (STREAMING-AWS4-HMAC-SHA256-PAYLOAD)."""
    key = signing_key(secret, amz_date[:8])
    out = b""
    prev = seed
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] + [b""]
    for n, chunk in enumerate(chunks):
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, EMPTY_SHA256, hashlib.sha256(chunk).hexdigest()])
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        sent = chunk
        if n == tamper_chunk and chunk:
            sent = bytes([chunk[0] ^ 1]) + chunk[1:]
        out += f"{len(chunk):x};chunk-signature={sig}\r\n".encode() + sent + b"\r\n"
        prev = sig
    return out


def now():
    return datetime.datetime.now(datetime.timezone.utc)
