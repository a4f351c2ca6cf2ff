//! A bucket's object ownership (`PUT /bucket?ownershipControls`, or `x-amz-object-ownership`
//! on CreateBucket): who owns the objects written into it, and whether ACLs count at all.
//!
//! - `ObjectWriter` (what a bucket without a setting does): the writer owns what it writes.
//! - `BucketOwnerPreferred`: an object written with the canned ACL `bucket-owner-full-control`
//!   belongs to the bucket's owner; others to their writer.
//! - `BucketOwnerEnforced`: ACLs are off. Every object belongs to the bucket's owner, and a
//!   request that sets an ACL other than `bucket-owner-full-control` (or a bucket ACL other
//!   than `private`) is refused with `AccessControlListNotSupported`; access is decided by
//!   ownership, grants, scopes and the bucket policy alone.

use serde::{Deserialize, Serialize};

use crate::xml::{to_xml, S3_NS};

/// The request header CreateBucket takes the setting in.
pub const OWNERSHIP_HEADER: &str = "x-amz-object-ownership";
/// Largest `OwnershipControls` document accepted.
pub const MAX_DOCUMENT: u64 = 4 * 1024;

/// The three settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ObjectOwnership {
    #[default]
    ObjectWriter,
    BucketOwnerPreferred,
    BucketOwnerEnforced,
}

/// Why a setting or document was refused; the text is what the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error("The XML you provided was not well-formed or did not validate against our published schema: {0}")]
    Malformed(String),
    #[error("Invalid x-amz-object-ownership value {0:?}: expected BucketOwnerEnforced, BucketOwnerPreferred or ObjectWriter.")]
    Unknown(String),
}

impl ObjectOwnership {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectOwnership::ObjectWriter => "ObjectWriter",
            ObjectOwnership::BucketOwnerPreferred => "BucketOwnerPreferred",
            ObjectOwnership::BucketOwnerEnforced => "BucketOwnerEnforced",
        }
    }

    /// A setting by its name (exact, as S3 spells it).
    pub fn parse(s: &str) -> Result<ObjectOwnership, OwnershipError> {
        match s.trim() {
            "ObjectWriter" => Ok(ObjectOwnership::ObjectWriter),
            "BucketOwnerPreferred" => Ok(ObjectOwnership::BucketOwnerPreferred),
            "BucketOwnerEnforced" => Ok(ObjectOwnership::BucketOwnerEnforced),
            other => Err(OwnershipError::Unknown(other.to_string())),
        }
    }

    /// Parses an `OwnershipControls` document: exactly one rule.
    pub fn from_xml(text: &str) -> Result<ObjectOwnership, OwnershipError> {
        let doc: Controls =
            quick_xml::de::from_str(text).map_err(|e| OwnershipError::Malformed(e.to_string()))?;
        match doc.rule.as_slice() {
            [one] => ObjectOwnership::parse(&one.object_ownership),
            _ => Err(OwnershipError::Malformed(
                "OwnershipControls holds exactly one Rule".into(),
            )),
        }
    }

    /// The `OwnershipControls` document GetBucketOwnershipControls answers.
    pub fn to_xml(self) -> String {
        to_xml(
            "OwnershipControls",
            &ControlsOut {
                xmlns: S3_NS,
                rule: RuleOut {
                    object_ownership: self.as_str(),
                },
            },
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Controls {
    #[serde(default)]
    rule: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Rule {
    object_ownership: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct ControlsOut {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    rule: RuleOut,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct RuleOut {
    object_ownership: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_round_trip_and_bad_ones_are_refused() {
        for o in [
            ObjectOwnership::ObjectWriter,
            ObjectOwnership::BucketOwnerPreferred,
            ObjectOwnership::BucketOwnerEnforced,
        ] {
            assert_eq!(ObjectOwnership::from_xml(&o.to_xml()), Ok(o));
            assert_eq!(ObjectOwnership::parse(o.as_str()), Ok(o));
        }
        let doc = r#"<OwnershipControls xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Rule><ObjectOwnership>BucketOwnerPreferred</ObjectOwnership></Rule></OwnershipControls>"#;
        assert_eq!(
            ObjectOwnership::from_xml(doc),
            Ok(ObjectOwnership::BucketOwnerPreferred)
        );
        assert!(ObjectOwnership::from_xml("<OwnershipControls/>").is_err());
        assert!(ObjectOwnership::from_xml("<x").is_err());
        assert!(ObjectOwnership::from_xml(&doc.replace("Preferred", "Maybe")).is_err());
        assert!(ObjectOwnership::parse("objectwriter").is_err());
    }
}
