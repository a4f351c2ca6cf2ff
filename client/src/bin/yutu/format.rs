//! How the CLI prints buckets, listings and object metadata.
//!
//! Columns are fixed-width and times are UTC ISO 8601, so that output lines up for people and
//! splits on whitespace for scripts (`awk '{print $3}'` is the key). Sizes are plain byte
//! counts for the same reason.

use yutu_client::timestamp::format_iso8601;
use yutu_client::{BucketInfo, BucketStatus, ObjectInfo, ObjectSummary};

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

/// `yutu stat BUCKET`: what HeadBucket says of the bucket.
pub fn bucket_stat_lines(bucket: &str, status: &BucketStatus) -> Vec<String> {
    let bytes = |n: Option<u64>| match n {
        Some(n) => format!("{n} ({})", human_bytes(n)),
        None => "-".to_string(),
    };
    vec![
        format!("Bucket:        {bucket}"),
        format!(
            "Durability:    {}",
            status.durability.as_deref().unwrap_or("-")
        ),
        format!(
            "Quota:         {}",
            match status.quota {
                Some(_) => bytes(status.quota),
                None => "none".to_string(),
            }
        ),
        format!("Usage:         {}", bytes(status.usage)),
    ]
}

/// A byte count for people, in binary units with one decimal (`512B`, `1.5KiB`, `64.0MiB`).
/// No space before the unit, so that a table cell stays one whitespace-separated field.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// Lines of a table: a header row, then `rows`, every column as wide as its widest cell and
/// two spaces between columns. Columns whose index is in `right` (numbers) are aligned right.
/// No line ends with spaces.
pub fn table(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> Vec<String> {
    let cols = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.take(cols).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right.contains(&i) {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.trim_end().to_string()
    };
    let mut lines = vec![line(&mut header.iter().copied())];
    lines.extend(rows.iter().map(|r| line(&mut r.iter().map(String::as_str))));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0B");
        assert_eq!(human_bytes(1023), "1023B");
        assert_eq!(human_bytes(1024), "1.0KiB");
        assert_eq!(human_bytes(1536), "1.5KiB");
        assert_eq!(human_bytes(64 << 20), "64.0MiB");
        assert_eq!(human_bytes(3 << 29), "1.5GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0EiB");
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["node0".to_string(), "up".to_string(), "7".to_string()],
            vec!["n1".to_string(), "draining".to_string(), "1234".to_string()],
        ];
        let lines = table(&["NAME", "STATE", "OBJECTS"], &rows, &[2]);
        assert_eq!(
            lines,
            vec![
                "NAME   STATE     OBJECTS",
                "node0  up              7",
                "n1     draining     1234",
            ]
        );
        // A left-aligned last column leaves no trailing spaces.
        let lines = table(&["A", "B"], &[vec!["x".into(), "".into()]], &[]);
        assert_eq!(lines, vec!["A  B", "x"]);
    }

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
