//! `Content-Encoding: aws-chunked` bodies: the framing SDKs use to stream an upload with
//! per-chunk signatures and/or checksums sent as trailers after the data.
//!
//! ```text
//! <hex size>[;chunk-signature=<sig>]\r\n<data>\r\n ... 0[;chunk-signature=<sig>]\r\n
//! [<trailer-name>:<value>\r\n ...][x-amz-trailer-signature:<sig>\r\n]\r\n
//! ```
//!
//! Each chunk signature chains from the previous one (the first from the request's seed
//! signature), so a reordered, dropped or altered chunk fails verification.

use yutu_api::sigv4::{signature, Scope};

use super::sigv4::{chunk_string_to_sign, signatures_match, trailer_string_to_sign};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("the aws-chunked body ends before its final chunk")]
    Truncated,
    #[error("the aws-chunked body is malformed: {0}")]
    Malformed(&'static str),
    #[error("a chunk signature does not match")]
    BadSignature,
    #[error("the trailer signature does not match")]
    BadTrailerSignature,
}

/// Verifies chunk signatures: the signing key of the request and the running signature.
pub struct ChunkSigner {
    /// The key the request's signature was made with (derived for `scope`).
    pub key: [u8; 32],
    pub amz_date: String,
    pub scope: Scope,
    /// The seed signature (of the request) at first, then the last verified chunk's.
    pub previous: String,
}

impl ChunkSigner {
    /// The signature the next chunk, `data`, must carry.
    fn chunk_signature(&self, data: &[u8]) -> String {
        signature(
            &self.key,
            &chunk_string_to_sign(&self.amz_date, &self.scope, &self.previous, data),
        )
    }

    /// The signature the trailer must carry (`name:value\n` for each trailing header).
    fn trailer_signature(&self, trailer: &str) -> String {
        signature(
            &self.key,
            &trailer_string_to_sign(&self.amz_date, &self.scope, &self.previous, trailer),
        )
    }
}

/// A decoded body: the payload and the trailing headers.
#[derive(Debug, Default)]
pub struct Decoded {
    pub data: Vec<u8>,
    pub trailers: Vec<(String, String)>,
}

fn line(raw: &[u8], pos: usize) -> Result<(&[u8], usize), ChunkError> {
    let rest = raw.get(pos..).ok_or(ChunkError::Truncated)?;
    let end = rest
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or(ChunkError::Truncated)?;
    Ok((&rest[..end], pos + end + 2))
}

/// Whether a request's body is aws-chunked framing, to be decoded before it is stored:
/// `streaming` (its `x-amz-content-sha256` is a `STREAMING-*` value), or `aws-chunked`
/// among its Content-Encoding together with the `x-amz-decoded-content-length` S3 requires
/// of every framed body.
///
/// Content-Encoding alone does not make a body framed: a client may name `aws-chunked` (or
/// list it twice) on a body it sends whole, with its hash, as boto3 does for
/// `put_object(ContentEncoding="aws-chunked")`; S3 stores that body as sent, with no
/// Content-Encoding (ceph/s3-tests `test_object_content_encoding_aws_chunked`), where
/// decoding it would refuse it as a truncated chunk.
pub fn is_framed(
    streaming: bool,
    content_encoding: Option<&str>,
    decoded_length: Option<&str>,
) -> bool {
    streaming
        || (decoded_length.is_some()
            && content_encoding.is_some_and(|v| {
                v.split(',')
                    .any(|e| e.trim().eq_ignore_ascii_case("aws-chunked"))
            }))
}

/// Decodes a whole aws-chunked body, verifying chunk (and trailer) signatures when `signer`
/// is given.
pub fn decode(raw: &[u8], mut signer: Option<ChunkSigner>) -> Result<Decoded, ChunkError> {
    let mut out = Decoded {
        data: Vec::with_capacity(raw.len()),
        trailers: Vec::new(),
    };
    let mut pos = 0;
    loop {
        let (header, next) = line(raw, pos)?;
        let header = std::str::from_utf8(header)
            .map_err(|_| ChunkError::Malformed("chunk header is not text"))?;
        let (size_hex, ext) = match header.split_once(';') {
            Some((s, e)) => (s.trim(), Some(e.trim())),
            None => (header.trim(), None),
        };
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| ChunkError::Malformed("bad chunk size"))?;
        let end = next
            .checked_add(size)
            .ok_or(ChunkError::Malformed("chunk size overflows"))?;
        let data = raw.get(next..end).ok_or(ChunkError::Truncated)?;
        if let Some(s) = signer.as_mut() {
            let sig = ext
                .and_then(|e| e.strip_prefix("chunk-signature="))
                .ok_or(ChunkError::Malformed("a chunk has no signature"))?;
            let expected = s.chunk_signature(data);
            if !signatures_match(&expected, sig) {
                return Err(ChunkError::BadSignature);
            }
            s.previous = expected;
        }
        out.data.extend_from_slice(data);
        if size == 0 {
            pos = end;
            break;
        }
        if raw.get(end..end + 2) != Some(b"\r\n") {
            return Err(if raw.len() < end + 2 {
                ChunkError::Truncated
            } else {
                ChunkError::Malformed("chunk data is not followed by CRLF")
            });
        }
        pos = end + 2;
    }
    // Trailers, until an empty line or the end of the body.
    let mut trailer_sig = None;
    let mut signed_text = String::new();
    while pos < raw.len() {
        let (l, next) = match line(raw, pos) {
            Ok(x) => x,
            // A last trailer line without its CRLF.
            Err(_) => (&raw[pos..], raw.len()),
        };
        pos = next;
        if l.is_empty() {
            break;
        }
        let text =
            std::str::from_utf8(l).map_err(|_| ChunkError::Malformed("trailer is not text"))?;
        let (name, value) = text
            .split_once(':')
            .ok_or(ChunkError::Malformed("trailer line has no ':'"))?;
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_string());
        if name == "x-amz-trailer-signature" {
            trailer_sig = Some(value);
        } else {
            signed_text.push_str(&format!("{name}:{value}\n"));
            out.trailers.push((name, value));
        }
    }
    if let Some(s) = signer.as_ref() {
        if !out.trailers.is_empty() || trailer_sig.is_some() {
            let sig = trailer_sig.ok_or(ChunkError::BadTrailerSignature)?;
            let expected = s.trailer_signature(&signed_text);
            if !signatures_match(&expected, &sig) {
                return Err(ChunkError::BadTrailerSignature);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::sigv4::Credential;
    use super::*;

    #[test]
    fn framing_needs_a_streaming_hash_or_a_decoded_length() {
        assert!(is_framed(true, None, None));
        assert!(is_framed(true, Some("gzip"), None));
        assert!(is_framed(false, Some("aws-chunked,gzip"), Some("10")));
        assert!(is_framed(false, Some("gzip, AWS-Chunked"), Some("10")));
        // Named on a body sent whole (no decoded length): not framing.
        assert!(!is_framed(false, Some("aws-chunked"), None));
        assert!(!is_framed(false, Some("aws-chunked, aws-chunked"), None));
        assert!(!is_framed(false, Some("gzip"), Some("10")));
        assert!(!is_framed(false, None, Some("10")));
    }

    #[test]
    fn unsigned_with_trailer() {
        let body = b"5\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n";
        let d = decode(body, None).unwrap();
        assert_eq!(d.data, b"hello world");
        assert_eq!(
            d.trailers,
            [("x-amz-checksum-crc32".to_string(), "DUoRhQ==".to_string())]
        );
        assert_eq!(
            decode(b"5\r\nhel", None).unwrap_err(),
            ChunkError::Truncated
        );
        assert_eq!(
            decode(b"5\r\nhello\r\n", None).unwrap_err(),
            ChunkError::Truncated
        );
        assert!(matches!(
            decode(b"zz\r\n", None),
            Err(ChunkError::Malformed(_))
        ));
        assert!(matches!(
            decode(b"2\r\nabcd\r\n0\r\n\r\n", None),
            Err(ChunkError::Malformed(_))
        ));
    }

    fn signer() -> ChunkSigner {
        let cred =
            Credential::parse("AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request").unwrap();
        ChunkSigner {
            key: cred
                .scope()
                .signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            amz_date: "20130524T000000Z".into(),
            scope: cred.scope(),
            previous: "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9".into(),
        }
    }

    fn documented_body() -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(b"10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n");
        body.extend_from_slice(&[b'a'; 65536]);
        body.extend_from_slice(b"\r\n400;chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n");
        body.extend_from_slice(&[b'a'; 1024]);
        body.extend_from_slice(b"\r\n0;chunk-signature=b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n");
        body
    }

    #[test]
    fn signed_chunks_verify_and_tampering_fails() {
        let d = decode(&documented_body(), Some(signer())).unwrap();
        assert_eq!(d.data.len(), 66560);
        let mut tampered = documented_body();
        let at = tampered.len() - 200;
        tampered[at] = b'b';
        assert_eq!(
            decode(&tampered, Some(signer())).unwrap_err(),
            ChunkError::BadSignature
        );
        let mut cut = documented_body();
        cut.truncate(66_000);
        assert_eq!(
            decode(&cut, Some(signer())).unwrap_err(),
            ChunkError::Truncated
        );
    }

    /// A signed body with a checksum trailer (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER`):
    /// the trailer signature chains from the final chunk's.
    #[test]
    fn signed_trailers_verify_and_tampering_fails() {
        let body = |trailer: &str, signature: Option<&str>| {
            let mut s = signer();
            let c1 = s.chunk_signature(b"hello");
            s.previous = c1.clone();
            let c2 = s.chunk_signature(b"");
            s.previous = c2.clone();
            let t = s.trailer_signature("x-amz-checksum-crc32:DUoRhQ==\n");
            let mut body = format!("5;chunk-signature={c1}\r\nhello\r\n0;chunk-signature={c2}\r\n");
            body.push_str(trailer);
            if let Some(sig) = signature {
                body.push_str(&format!(
                    "x-amz-trailer-signature:{}\r\n",
                    sig.replace("{t}", &t)
                ));
            }
            body.push_str("\r\n");
            body.into_bytes()
        };
        let good = body("x-amz-checksum-crc32:DUoRhQ==\r\n", Some("{t}"));
        let d = decode(&good, Some(signer())).unwrap();
        assert_eq!(d.data, b"hello");
        assert_eq!(
            d.trailers,
            [("x-amz-checksum-crc32".to_string(), "DUoRhQ==".to_string())]
        );
        // Names are case-insensitive, values trimmed, as signed.
        let loose = body("X-Amz-Checksum-CRC32: DUoRhQ== \r\n", Some("{t}"));
        assert!(decode(&loose, Some(signer())).is_ok());
        for bad in [
            body("x-amz-checksum-crc32:AAAAAA==\r\n", Some("{t}")),
            body("x-amz-checksum-crc32:DUoRhQ==\r\n", None),
            body("x-amz-checksum-crc32:DUoRhQ==\r\n", Some("0{t}")),
        ] {
            assert_eq!(
                decode(&bad, Some(signer())).unwrap_err(),
                ChunkError::BadTrailerSignature
            );
        }
        // Unsigned, the trailer is only read.
        let d = decode(&body("x-amz-checksum-crc32:AAAAAA==\r\n", None), None).unwrap();
        assert_eq!(d.trailers[0].1, "AAAAAA==");
    }
}
