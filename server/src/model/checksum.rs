//! The integrity checksums S3 clients send: `x-amz-checksum-{crc32,crc32c,crc64nvme,sha1,sha256}`
//! (base64 of the big-endian digest) and `Content-MD5`.
//!
//! Current SDKs compute one of them by default on every upload, in a header or in an
//! `aws-chunked` trailer, and ask for it back on downloads (`x-amz-checksum-mode: ENABLED`) to
//! verify what they read. Yutu verifies it on the way in, stores it with the object and returns
//! it on whole-object reads.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// A checksum algorithm S3 defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Crc64Nvme,
        Algorithm::Sha1,
        Algorithm::Sha256,
    ];

    /// The name as in `x-amz-sdk-checksum-algorithm` and XML (`CRC32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    /// The header carrying the value, `x-amz-checksum-crc32` and so on.
    pub fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    pub fn from_header(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.header().eq_ignore_ascii_case(name))
    }

    /// Whether the algorithm is a CRC, whose whole-object value can be computed for a
    /// multipart object (S3's `FULL_OBJECT` checksum type).
    pub fn is_crc(self) -> bool {
        matches!(
            self,
            Algorithm::Crc32 | Algorithm::Crc32c | Algorithm::Crc64Nvme
        )
    }

    /// The base64 digest of `data`.
    pub fn digest(self, data: &[u8]) -> String {
        let mut h = Hasher::new(self);
        h.update(data);
        h.finish()
    }
}

/// An incremental checksum.
pub enum Hasher {
    Crc32(crc32fast::Hasher),
    Crc32c(u32),
    Crc64(crc64fast_nvme::Digest),
    Sha1(Sha1),
    Sha256(Sha256),
}

impl Hasher {
    pub fn new(alg: Algorithm) -> Hasher {
        match alg {
            Algorithm::Crc32 => Hasher::Crc32(crc32fast::Hasher::new()),
            Algorithm::Crc32c => Hasher::Crc32c(0),
            Algorithm::Crc64Nvme => Hasher::Crc64(crc64fast_nvme::Digest::new()),
            Algorithm::Sha1 => Hasher::Sha1(Sha1::new()),
            Algorithm::Sha256 => Hasher::Sha256(Sha256::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc32(h) => h.update(data),
            Hasher::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            Hasher::Crc64(h) => h.write(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
        }
    }

    /// Base64 of the big-endian digest, as S3 writes it.
    pub fn finish(self) -> String {
        match self {
            Hasher::Crc32(h) => B64.encode(h.finalize().to_be_bytes()),
            Hasher::Crc32c(c) => B64.encode(c.to_be_bytes()),
            Hasher::Crc64(h) => B64.encode(h.sum64().to_be_bytes()),
            Hasher::Sha1(h) => B64.encode(h.finalize()),
            Hasher::Sha256(h) => B64.encode(h.finalize()),
        }
    }

    /// The raw digest bytes, for composite (checksum-of-checksums) values.
    pub fn finish_raw(self) -> Vec<u8> {
        B64.decode(self.finish()).unwrap_or_default()
    }
}

/// A stored checksum: algorithm, base64 value, and for multipart objects whether the value
/// is a checksum of the part checksums (`COMPOSITE`, written `value-N`) or of the whole object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub algorithm: Algorithm,
    pub value: String,
    pub composite_parts: Option<u32>,
}

impl Checksum {
    /// The header value: `value` or `value-N`.
    pub fn header_value(&self) -> String {
        match self.composite_parts {
            Some(n) => format!("{}-{n}", self.value),
            None => self.value.clone(),
        }
    }

    pub fn type_name(&self) -> &'static str {
        if self.composite_parts.is_some() {
            "COMPOSITE"
        } else {
            "FULL_OBJECT"
        }
    }
}

/// Hex SHA-256 of `data` (for `x-amz-content-sha256` and SigV4).
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// MD5 of `data`.
pub fn md5(data: &[u8]) -> [u8; 16] {
    Md5::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Values computed by botocore for b"hello world".
        let data = b"hello world";
        assert_eq!(Algorithm::Crc32.digest(data), "DUoRhQ==");
        assert_eq!(Algorithm::Crc32c.digest(data), "yZRlqg==");
        assert_eq!(Algorithm::Sha1.digest(data), "Kq5sNclPz7QV2+lfQIuc6R7oRu0=");
        assert_eq!(
            Algorithm::Sha256.digest(data),
            "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="
        );
        // The CRC-64/NVME check value (the CRC of "123456789") is 0xae8b14860a799888.
        assert_eq!(
            Algorithm::Crc64Nvme.digest(b"123456789"),
            B64.encode(0xae8b_1486_0a79_9888u64.to_be_bytes())
        );
        assert_eq!(Algorithm::from_name("crc32c"), Some(Algorithm::Crc32c));
        assert_eq!(
            Algorithm::from_header("X-Amz-Checksum-Sha256"),
            Some(Algorithm::Sha256)
        );
        let mut h = Hasher::new(Algorithm::Crc32);
        h.update(b"hello ");
        h.update(b"world");
        assert_eq!(h.finish(), "DUoRhQ==");
    }
}
