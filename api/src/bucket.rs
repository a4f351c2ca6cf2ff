//! Bucket naming rules, as S3 states them for general-purpose buckets.
//!
//! Names are DNS labels so that virtual-host addressing (`bucket.host`) keeps working:
//! 3 to 63 characters of lowercase letters, digits, dots and hyphens, starting and ending
//! with a letter or digit, no two adjacent dots, no hyphen next to a dot, not shaped like an
//! IPv4 address, and none of the prefixes and suffixes S3 reserves.

/// Why a bucket name was refused. The text is what the client sees in the S3 error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketNameError {
    #[error("bucket name must be between 3 and 63 characters long")]
    Length,
    #[error("bucket name may contain only lowercase letters, digits, dots and hyphens")]
    Charset,
    #[error("bucket name must begin and end with a letter or digit")]
    Edges,
    #[error("bucket name must not contain two adjacent periods")]
    AdjacentDots,
    #[error("bucket name must not contain a hyphen next to a period")]
    DashNextToDot,
    #[error("bucket name must not be formatted as an IP address")]
    IpAddress,
    #[error("bucket name uses a reserved prefix or suffix")]
    Reserved,
}

/// Header naming a bucket's durability at creation (`memory` or `disk`); HeadBucket answers
/// with it too.
pub const DURABILITY_HEADER: &str = "x-yutu-durability";

/// Header setting a bucket's quota at creation: most bytes of objects it may hold, a size
/// such as `10GiB` or a plain byte count. HeadBucket answers with it (in bytes).
pub const QUOTA_HEADER: &str = "x-yutu-quota";

/// HeadBucket's answer: the bytes of objects the bucket holds, as the answering node knows
/// them (in a cluster, a few seconds behind the other nodes' writes).
pub const USAGE_HEADER: &str = "x-yutu-usage";

/// Path segments the server answers itself (`/admin/...`, `/health`, `/ready`, `/metrics`): a bucket of that
/// name could never be listed in path style, so creating one is refused.
pub const RESERVED_NAMES: &[&str] = &["admin", "health", "ready", "metrics"];

/// Checks `name` against S3's bucket naming rules and Yutu's reserved names.
pub fn validate_bucket_name(name: &str) -> Result<(), BucketNameError> {
    let bytes = name.as_bytes();
    if !(3..=63).contains(&bytes.len()) {
        return Err(BucketNameError::Length);
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-')
    {
        return Err(BucketNameError::Charset);
    }
    let edge_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge_ok(bytes[0]) || !edge_ok(bytes[bytes.len() - 1]) {
        return Err(BucketNameError::Edges);
    }
    if name.contains("..") {
        return Err(BucketNameError::AdjacentDots);
    }
    // Each dot-separated label is a DNS label, which starts and ends with a letter or digit:
    // `foo.-bar` and `foo-.bar` cannot be virtual-host addressed (S3's DNS-compatible naming
    // rules; Ceph RGW refuses them, ceph/s3-tests `test_bucket_create_naming_dns_dot_dash`).
    if name.contains(".-") || name.contains("-.") {
        return Err(BucketNameError::DashNextToDot);
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(BucketNameError::IpAddress);
    }
    const PREFIXES: &[&str] = &["xn--", "sthree-", "amzn-s3-demo-"];
    const SUFFIXES: &[&str] = &["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"];
    if PREFIXES.iter().any(|p| name.starts_with(p))
        || SUFFIXES.iter().any(|s| name.ends_with(s))
        || RESERVED_NAMES.contains(&name)
    {
        return Err(BucketNameError::Reserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for n in ["abc", "my-bucket", "a.b.c", "0123", &"a".repeat(63)] {
            assert_eq!(validate_bucket_name(n), Ok(()), "{n}");
        }
    }

    #[test]
    fn refuses_each_rule() {
        let cases = [
            ("ab", BucketNameError::Length),
            (&"a".repeat(64) as &str, BucketNameError::Length),
            ("Abc", BucketNameError::Charset),
            ("a_b", BucketNameError::Charset),
            ("-ab", BucketNameError::Edges),
            ("ab.", BucketNameError::Edges),
            ("a..b", BucketNameError::AdjacentDots),
            ("foo.-bar", BucketNameError::DashNextToDot),
            ("foo-.bar", BucketNameError::DashNextToDot),
            ("192.168.1.1", BucketNameError::IpAddress),
            ("xn--abc", BucketNameError::Reserved),
            ("abc-s3alias", BucketNameError::Reserved),
            ("metrics", BucketNameError::Reserved),
        ];
        for (n, e) in cases {
            assert_eq!(validate_bucket_name(n), Err(e), "{n}");
        }
    }
}
