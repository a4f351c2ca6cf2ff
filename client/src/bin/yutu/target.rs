//! Reading `BUCKET[/KEY]` command-line arguments.
//!
//! The CLI names objects the way `aws s3` does, with an optional `s3://` in front, so that
//! commands can be pasted between the two. The first `/` ends the bucket; everything after
//! it, slashes included, is the key (or the prefix, for `ls`).

use anyhow::{bail, Result};

/// A bucket and a key or prefix (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub bucket: String,
    pub key: String,
}

impl Target {
    pub fn parse(arg: &str) -> Result<Target> {
        let rest = arg.strip_prefix("s3://").unwrap_or(arg);
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            bail!("{arg:?} does not name a bucket (expected BUCKET or BUCKET/KEY)");
        }
        Ok(Target {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// Parses an argument that must name one object.
    pub fn parse_object(arg: &str) -> Result<Target> {
        let t = Target::parse(arg)?;
        if t.key.is_empty() {
            bail!("{arg:?} does not name an object (expected BUCKET/KEY)");
        }
        Ok(t)
    }

    /// Parses a bucket-only argument (`mb`, `rb`); a trailing `/` is tolerated.
    pub fn parse_bucket(arg: &str) -> Result<String> {
        let t = Target::parse(arg)?;
        if !t.key.is_empty() {
            bail!("{arg:?} names an object; expected a bucket");
        }
        Ok(t.bucket)
    }

    /// The key to upload `file_name` to: the key itself, or, when the key is empty or ends
    /// with `/` (a "folder"), the folder plus the file's name, as `aws s3 cp` does.
    pub fn upload_key(&self, file_name: Option<&str>) -> Result<String> {
        if !self.key.is_empty() && !self.key.ends_with('/') {
            return Ok(self.key.clone());
        }
        match file_name {
            Some(name) => Ok(format!("{}{name}", self.key)),
            None => bail!(
                "s3://{}/{} needs a key: stdin has no file name to use",
                self.bucket,
                self.key
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(b: &str, k: &str) -> Target {
        Target {
            bucket: b.into(),
            key: k.into(),
        }
    }

    #[test]
    fn splits_at_the_first_slash() {
        assert_eq!(Target::parse("b").unwrap(), t("b", ""));
        assert_eq!(Target::parse("b/").unwrap(), t("b", ""));
        assert_eq!(Target::parse("b/a/b/c").unwrap(), t("b", "a/b/c"));
        assert_eq!(Target::parse("s3://b/k").unwrap(), t("b", "k"));
        assert_eq!(Target::parse("b//k").unwrap(), t("b", "/k"));
        assert!(Target::parse("").is_err());
        assert!(Target::parse("/k").is_err());
        assert!(Target::parse("s3://").is_err());
    }

    #[test]
    fn objects_need_keys_buckets_refuse_them() {
        assert!(Target::parse_object("b").is_err());
        assert!(Target::parse_object("b/").is_err());
        assert_eq!(Target::parse_object("b/k").unwrap(), t("b", "k"));
        assert_eq!(Target::parse_bucket("b/").unwrap(), "b");
        assert!(Target::parse_bucket("b/k").is_err());
    }

    #[test]
    fn upload_keys() {
        assert_eq!(t("b", "k").upload_key(Some("f.txt")).unwrap(), "k");
        assert_eq!(
            t("b", "dir/").upload_key(Some("f.txt")).unwrap(),
            "dir/f.txt"
        );
        assert_eq!(t("b", "").upload_key(Some("f.txt")).unwrap(), "f.txt");
        assert!(t("b", "").upload_key(None).is_err());
        assert_eq!(t("b", "k").upload_key(None).unwrap(), "k");
    }
}
