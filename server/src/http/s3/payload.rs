//! Receiving an upload body: bounded reading, `aws-chunked` decoding with chunk signatures,
//! `x-amz-content-sha256`, `x-amz-checksum-*` (header or trailer) and `Content-MD5`.
//!
//! Nothing is stored unless every check passes, so a failed upload leaves no trace.

use base64::Engine;
use bytes::Bytes;
use hyper::body::Incoming;
use yutu_api::S3ErrorCode;

use crate::auth::authenticate::Payload;
use crate::auth::chunked::{decode, ChunkError};
use crate::http::body::{content_length, read_limited, Reservation};
use crate::http::ctx::Ctx;
use crate::http::error::S3Error;
use crate::model::checksum::{md5, sha256_hex, Algorithm, Checksum};

/// A verified upload body.
pub struct Received {
    pub data: Bytes,
    pub md5: [u8; 16],
    /// The checksum the client sent (verified), or the one the bucket asked for.
    pub checksum: Option<Checksum>,
    /// The body's share of the node's body budget, held until the upload is done with.
    pub reservation: Reservation,
}

/// Framing overhead allowed on top of the payload limit for an `aws-chunked` body.
fn chunked_allowance(limit: u64) -> u64 {
    limit / 32 + 64 * 1024
}

/// Checks the announced size against `limit` before any byte is read.
pub fn precheck(ctx: &Ctx, limit: u64, limit_what: &str) -> Result<(), S3Error> {
    let announced = match ctx.header("x-amz-decoded-content-length") {
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            S3Error::new(S3ErrorCode::InvalidArgument).msg("Invalid x-amz-decoded-content-length.")
        })?),
        None if matches!(ctx.auth.payload, Payload::Chunked { .. }) => None,
        None => content_length(ctx)?,
    };
    let chunked_te = ctx
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if content_length(ctx)?.is_none() && !chunked_te {
        return Err(S3Error::new(S3ErrorCode::MissingContentLength));
    }
    if let Some(n) = announced {
        if n > limit {
            return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                "Your proposed upload of {n} bytes exceeds {limit_what} of {limit} bytes."
            )));
        }
    }
    Ok(())
}

/// Reads and verifies the body of an upload of at most `limit` payload bytes.
pub async fn receive(ctx: &Ctx, body: Incoming, limit: u64) -> Result<Received, S3Error> {
    receive_with(ctx, body, limit, true).await
}

/// Reads and verifies a request document (CompleteMultipartUpload's part list) of at most
/// `limit` bytes. Its `x-amz-checksum-*` headers are not the document's: they name the
/// checksum of the object the request makes, which its handler checks. Verifying them
/// against the XML would refuse every CompleteMultipartUpload that names one (BadDigest).
/// Its hash, Content-MD5 and checksum trailers still cover the document.
pub async fn receive_document(ctx: &Ctx, body: Incoming, limit: u64) -> Result<Received, S3Error> {
    receive_with(ctx, body, limit, false).await
}

async fn receive_with(
    ctx: &Ctx,
    body: Incoming,
    limit: u64,
    checksum_headers: bool,
) -> Result<Received, S3Error> {
    let chunked = crate::auth::chunked::is_framed(
        matches!(ctx.auth.payload, Payload::Chunked { .. }),
        ctx.header("content-encoding"),
        ctx.header("x-amz-decoded-content-length"),
    );
    let raw_limit = if chunked {
        limit + chunked_allowance(limit)
    } else {
        limit
    };
    let read = read_limited(ctx, body, raw_limit).await?;
    let (raw, reservation) = (read.data, read.reservation);
    ctx.shard.metrics.bytes_in.add(raw.len() as u64);
    let (data, trailers) = if chunked {
        let signer = ctx
            .auth
            .signer
            .as_ref()
            .map(|s| crate::auth::chunked::ChunkSigner {
                key: s.key,
                amz_date: s.amz_date.clone(),
                scope: s.scope.clone(),
                previous: s.previous.clone(),
            });
        let decoded = decode(&raw, signer).map_err(|e| match e {
            ChunkError::Truncated => S3Error::new(S3ErrorCode::IncompleteBody).msg(e.to_string()),
            ChunkError::Malformed(_) => {
                S3Error::new(S3ErrorCode::InvalidRequest).msg(e.to_string())
            }
            ChunkError::BadSignature | ChunkError::BadTrailerSignature => {
                S3Error::new(S3ErrorCode::SignatureDoesNotMatch).msg(e.to_string())
            }
        })?;
        if decoded.data.len() as u64 > limit {
            return Err(S3Error::new(S3ErrorCode::EntityTooLarge));
        }
        if let Some(n) = ctx.header("x-amz-decoded-content-length") {
            if n.parse::<u64>().ok() != Some(decoded.data.len() as u64) {
                return Err(S3Error::new(S3ErrorCode::IncompleteBody)
                    .msg("The decoded body length does not match x-amz-decoded-content-length."));
            }
        }
        // The framed copy is not needed once decoded: hold one copy, not two.
        drop(raw);
        (Bytes::from(decoded.data), decoded.trailers)
    } else {
        (raw, Vec::new())
    };
    if let Payload::Sha256(want) = &ctx.auth.payload {
        if sha256_hex(&data) != *want {
            return Err(S3Error::new(S3ErrorCode::XAmzContentSHA256Mismatch));
        }
    }
    let digest = md5(&data);
    if let Some(v) = ctx.header("content-md5") {
        let want = base64::engine::general_purpose::STANDARD
            .decode(v)
            .ok()
            .filter(|d| d.len() == 16)
            .ok_or_else(|| S3Error::new(S3ErrorCode::InvalidDigest))?;
        if want != digest {
            return Err(S3Error::new(S3ErrorCode::BadDigest));
        }
    }
    let checksum = verify_checksum(ctx, &data, &trailers, checksum_headers)?;
    Ok(Received {
        data,
        md5: digest,
        checksum,
        reservation,
    })
}

/// The client's checksum, from a header or a trailer, verified against the data. When the
/// client names an algorithm (`x-amz-sdk-checksum-algorithm`) but sends no value, the value is
/// computed so that it can be returned later. Without `headers`, only trailers describe the
/// body (see [`receive_document`]).
fn verify_checksum(
    ctx: &Ctx,
    data: &[u8],
    trailers: &[(String, String)],
    headers: bool,
) -> Result<Option<Checksum>, S3Error> {
    let mut given: Vec<(Algorithm, String)> = Vec::new();
    for (name, value) in ctx.headers.iter().filter(|_| headers) {
        if let Some(alg) = Algorithm::from_header(name.as_str()) {
            given.push((alg, value.to_str().unwrap_or("").to_string()));
        }
    }
    for (name, value) in trailers {
        if let Some(alg) = Algorithm::from_header(name) {
            given.push((alg, value.clone()));
        }
    }
    if given.len() > 1 {
        return Err(S3Error::new(S3ErrorCode::InvalidRequest).msg(
            "Expecting a single x-amz-checksum- header. Multiple checksum types are not allowed.",
        ));
    }
    if let Some(trailer) = ctx.header("x-amz-trailer") {
        if Algorithm::from_header(trailer.trim()).is_some() && given.is_empty() {
            return Err(S3Error::new(S3ErrorCode::IncompleteBody).msg(format!(
                "The trailer {trailer} announced in x-amz-trailer is missing."
            )));
        }
    }
    if let Some((alg, value)) = given.pop() {
        let actual = alg.digest(data);
        if actual != value {
            return Err(S3Error::new(S3ErrorCode::BadDigest).msg(format!(
                "The {} you specified did not match the calculated checksum.",
                alg.name()
            )));
        }
        return Ok(Some(Checksum {
            algorithm: alg,
            value,
            composite_parts: None,
        }));
    }
    if !headers {
        return Ok(None);
    }
    let requested = ctx
        .header("x-amz-sdk-checksum-algorithm")
        .or_else(|| ctx.header("x-amz-checksum-algorithm"));
    Ok(requested
        .and_then(Algorithm::from_name)
        .map(|alg| Checksum {
            algorithm: alg,
            value: alg.digest(data),
            composite_parts: None,
        }))
}
