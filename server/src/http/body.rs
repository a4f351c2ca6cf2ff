//! Reading request bodies within limits.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use yutu_api::S3ErrorCode;

use super::error::S3Error;

/// Reads the whole body, refusing it as soon as it grows past `limit` bytes.
///
/// `expected` (the Content-Length) sizes the buffer up front so that a large object is
/// received into one allocation; hyper itself rejects a body that ends short of it.
pub async fn read_limited(
    mut body: Incoming,
    expected: Option<u64>,
    limit: u64,
) -> Result<Bytes, S3Error> {
    let mut buf = BytesMut::with_capacity(expected.unwrap_or(0).min(limit) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            S3Error::new(S3ErrorCode::IncompleteBody).msg(format!("Reading the body failed: {e}."))
        })?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > limit {
                return Err(S3Error::new(S3ErrorCode::EntityTooLarge).msg(format!(
                    "Your proposed upload exceeds the maximum allowed size of {limit} bytes."
                )));
            }
            buf.extend_from_slice(&data);
        }
    }
    if let Some(n) = expected {
        if buf.len() as u64 != n {
            return Err(S3Error::new(S3ErrorCode::IncompleteBody));
        }
    }
    Ok(buf.freeze())
}
