//! How the CLI prints buckets, listings and object metadata.
//!
//! Columns are fixed-width and times are UTC ISO 8601, so that output lines up for people and
//! splits on whitespace for scripts (`awk '{print $3}'` is the key). Sizes are plain byte
//! counts for the same reason.

use yutu_client::timestamp::format_iso8601;
use yutu_client::{BucketInfo, ObjectInfo, ObjectSummary};

/// Width of the size column: fits 999 TB.
const SIZE_WIDTH: usize = 15;
/// Width of an ISO 8601 timestamp with seconds, `2026-01-01T00:00:00Z`.
const TIME_WIDTH: usize = 20;

/// `2026-01-01T00:00:00Z  bucket`
pub fn bucket_line(b: &BucketInfo) -> String {
    format!("{}  {}", format_iso8601(b.creation_date), b.name)
}

/// `           1234  2026-01-01T00:00:00Z  key`
pub fn object_line(o: &ObjectSummary) -> String {
    format!(
        "{:>SIZE_WIDTH$}  {}  {}",
        o.size,
        format_iso8601(o.last_modified),
        o.key
    )
}

/// `            PRE                        prefix/`, aligned with the key column.
pub fn prefix_line(prefix: &str) -> String {
    format!("{:>SIZE_WIDTH$}  {:TIME_WIDTH$}  {prefix}", "PRE", "")
}

/// The `stat` report: one `Field: value` line each.
pub fn stat_lines(bucket: &str, key: &str, info: &ObjectInfo) -> Vec<String> {
    vec![
        format!("Bucket:        {bucket}"),
        format!("Key:           {key}"),
        format!("Size:          {}", info.size),
        format!("ETag:          \"{}\"", info.etag),
        format!("Last-Modified: {}", format_iso8601(info.last_modified)),
        format!(
            "Content-Type:  {}",
            info.content_type.as_deref().unwrap_or("-")
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn jan1() -> std::time::SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_767_225_600)
    }

    #[test]
    fn listing_columns_line_up() {
        let obj = object_line(&ObjectSummary {
            key: "dir/a b".into(),
            size: 1234,
            etag: "e".into(),
            last_modified: jan1(),
        });
        let pre = prefix_line("dir/sub/");
        assert_eq!(obj, "           1234  2026-01-01T00:00:00Z  dir/a b");
        assert_eq!(pre, "            PRE                        dir/sub/");
        assert_eq!(obj.find("dir/"), pre.find("dir/"));
    }

    #[test]
    fn buckets_and_stat() {
        let b = BucketInfo {
            name: "models".into(),
            creation_date: jan1(),
        };
        assert_eq!(bucket_line(&b), "2026-01-01T00:00:00Z  models");
        let info = ObjectInfo {
            size: 5,
            etag: "abc".into(),
            last_modified: jan1(),
            content_type: None,
        };
        let lines = stat_lines("b", "k", &info);
        assert!(lines.contains(&"Size:          5".to_string()));
        assert!(lines.contains(&"ETag:          \"abc\"".to_string()));
        assert!(lines.contains(&"Content-Type:  -".to_string()));
    }
}
