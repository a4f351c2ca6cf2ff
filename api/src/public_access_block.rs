//! A bucket's public access block (`PUT /bucket?publicAccessBlock`) and the policy status
//! (`GET /bucket?policyStatus`) documents.
//!
//! The four settings each switch one kind of public access off, whatever ACLs and the
//! bucket policy say:
//!
//! - `BlockPublicAcls`: refuse requests that set a public ACL (canned `public-read`,
//!   `public-read-write`, `authenticated-read`, or grants to `AllUsers`/`AuthenticatedUsers`).
//! - `IgnorePublicAcls`: grants to `AllUsers`/`AuthenticatedUsers` count for nothing.
//! - `BlockPublicPolicy`: refuse a PutBucketPolicy whose policy is public
//!   ([`crate::bucket_policy::BucketPolicy::is_public`]).
//! - `RestrictPublicBuckets`: while the bucket's policy is public, only the owner (and users
//!   the policy names) get access through it, not anonymous or other callers.
//!
//! An element that is absent is `false`, as in S3. Enforcing them is the server's job; this
//! module reads and writes the documents.

use serde::{Deserialize, Serialize};

use crate::xml::{to_xml, S3_NS};
use crate::S3ErrorCode;

/// The root element of the configuration document.
pub const CONFIGURATION_ROOT: &str = "PublicAccessBlockConfiguration";
/// The root element of GetBucketPolicyStatus's answer.
pub const POLICY_STATUS_ROOT: &str = "PolicyStatus";
/// Largest configuration document accepted: the four booleans and their names fit in well
/// under 1 KiB, so anything much larger is not one.
pub const MAX_DOCUMENT: u64 = 8 * 1024;

/// Why a document was refused; the text is what the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicAccessBlockError {
    #[error("The XML you provided was not well-formed or did not validate against our published schema: {0}")]
    Malformed(String),
}

impl PublicAccessBlockError {
    /// The S3 error this refusal is answered with.
    pub fn s3_code(&self) -> S3ErrorCode {
        S3ErrorCode::MalformedXML
    }
}

/// A bucket's public access block. `Default` is S3's state without one: nothing blocked.
/// Serializes (for storage) with its field names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublicAccessBlock {
    #[serde(default)]
    pub block_public_acls: bool,
    #[serde(default)]
    pub ignore_public_acls: bool,
    #[serde(default)]
    pub block_public_policy: bool,
    #[serde(default)]
    pub restrict_public_buckets: bool,
}

/// `<PublicAccessBlockConfiguration>` as read: each element as its text, so a bad value is
/// reported by name instead of as a serde error.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct XmlIn {
    #[serde(default)]
    block_public_acls: Option<String>,
    #[serde(default)]
    ignore_public_acls: Option<String>,
    #[serde(default)]
    block_public_policy: Option<String>,
    #[serde(default)]
    restrict_public_buckets: Option<String>,
}

/// `<PublicAccessBlockConfiguration>` as written: every element, as GetPublicAccessBlock
/// answers.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct XmlOut {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    block_public_acls: bool,
    ignore_public_acls: bool,
    block_public_policy: bool,
    restrict_public_buckets: bool,
}

/// An `xsd:boolean`: `true`, `false`, `1` or `0` (surrounding whitespace allowed, and
/// `TRUE`/`FALSE` in any case, which some clients send).
fn xml_bool(name: &str, value: Option<&str>) -> Result<bool, PublicAccessBlockError> {
    let Some(v) = value else {
        return Ok(false);
    };
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        t if t.eq_ignore_ascii_case("true") => Ok(true),
        t if t.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(PublicAccessBlockError::Malformed(format!(
            "{name} must be true or false"
        ))),
    }
}

/// The name of the first element of an XML document (after the declaration, comments and
/// processing instructions), without a namespace prefix.
fn root_name(text: &str) -> Option<&str> {
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        rest = rest.strip_prefix('<')?;
        if let Some(r) = rest.strip_prefix("!--") {
            rest = &r[r.find("-->")? + 3..];
        } else if rest.starts_with('?') || rest.starts_with('!') {
            rest = &rest[rest.find('>')? + 1..];
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
                .unwrap_or(rest.len());
            let name = &rest[..end];
            return Some(name.rsplit(':').next().unwrap_or(name));
        }
    }
}

/// Refuses a document whose root element is not `want` (quick-xml's deserializer does not
/// look at it, and a client sending the wrong document should hear so).
fn check_root(text: &str, want: &str) -> Result<(), PublicAccessBlockError> {
    match root_name(text) {
        Some(name) if name == want => Ok(()),
        _ => Err(PublicAccessBlockError::Malformed(format!(
            "the document is not a {want}"
        ))),
    }
}

impl PublicAccessBlock {
    /// Parses a PutPublicAccessBlock body (also GetPublicAccessBlock's answer, for clients).
    pub fn parse(text: &str) -> Result<PublicAccessBlock, PublicAccessBlockError> {
        if text.len() as u64 > MAX_DOCUMENT {
            return Err(PublicAccessBlockError::Malformed(format!(
                "the document is over {MAX_DOCUMENT} bytes"
            )));
        }
        check_root(text, CONFIGURATION_ROOT)?;
        let doc: XmlIn = quick_xml::de::from_str(text)
            .map_err(|e| PublicAccessBlockError::Malformed(e.to_string()))?;
        Ok(PublicAccessBlock {
            block_public_acls: xml_bool("BlockPublicAcls", doc.block_public_acls.as_deref())?,
            ignore_public_acls: xml_bool("IgnorePublicAcls", doc.ignore_public_acls.as_deref())?,
            block_public_policy: xml_bool("BlockPublicPolicy", doc.block_public_policy.as_deref())?,
            restrict_public_buckets: xml_bool(
                "RestrictPublicBuckets",
                doc.restrict_public_buckets.as_deref(),
            )?,
        })
    }

    /// The `PublicAccessBlockConfiguration` document, every element present, with the XML
    /// declaration and S3's namespace.
    pub fn to_xml(&self) -> String {
        to_xml(
            CONFIGURATION_ROOT,
            &XmlOut {
                xmlns: S3_NS,
                block_public_acls: self.block_public_acls,
                ignore_public_acls: self.ignore_public_acls,
                block_public_policy: self.block_public_policy,
                restrict_public_buckets: self.restrict_public_buckets,
            },
        )
    }

    /// Whether no setting is on (the same as having no configuration).
    pub fn is_empty(&self) -> bool {
        *self == PublicAccessBlock::default()
    }
}

/// GetBucketPolicyStatus's answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyStatus {
    pub is_public: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct PolicyStatusOut {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    is_public: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PolicyStatusIn {
    #[serde(default)]
    is_public: Option<String>,
}

impl PolicyStatus {
    /// `<PolicyStatus><IsPublic>true</IsPublic></PolicyStatus>`, with the XML declaration
    /// and S3's namespace.
    pub fn to_xml(&self) -> String {
        to_xml(
            POLICY_STATUS_ROOT,
            &PolicyStatusOut {
                xmlns: S3_NS,
                is_public: self.is_public,
            },
        )
    }

    /// Parses GetBucketPolicyStatus's answer (for clients); an absent `IsPublic` is `false`.
    pub fn parse(text: &str) -> Result<PolicyStatus, PublicAccessBlockError> {
        check_root(text, POLICY_STATUS_ROOT)?;
        let doc: PolicyStatusIn = quick_xml::de::from_str(text)
            .map_err(|e| PublicAccessBlockError::Malformed(e.to_string()))?;
        Ok(PolicyStatus {
            is_public: xml_bool("IsPublic", doc.is_public.as_deref())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_configuration_round_trips() {
        let all = PublicAccessBlock {
            block_public_acls: true,
            ignore_public_acls: false,
            block_public_policy: true,
            restrict_public_buckets: false,
        };
        let xml = all.to_xml();
        assert!(xml.starts_with("<?xml"), "{xml}");
        assert!(xml.contains(r#"<PublicAccessBlockConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">"#), "{xml}");
        assert!(
            xml.contains("<BlockPublicAcls>true</BlockPublicAcls>"),
            "{xml}"
        );
        assert!(
            xml.contains("<IgnorePublicAcls>false</IgnorePublicAcls>"),
            "{xml}"
        );
        assert_eq!(PublicAccessBlock::parse(&xml).unwrap(), all);
        for bits in 0..16u8 {
            let c = PublicAccessBlock {
                block_public_acls: bits & 1 != 0,
                ignore_public_acls: bits & 2 != 0,
                block_public_policy: bits & 4 != 0,
                restrict_public_buckets: bits & 8 != 0,
            };
            assert_eq!(PublicAccessBlock::parse(&c.to_xml()).unwrap(), c);
            assert_eq!(c.is_empty(), bits == 0);
        }
    }

    #[test]
    fn absent_elements_are_false() {
        let doc = r#"<PublicAccessBlockConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
            <RestrictPublicBuckets>true</RestrictPublicBuckets>
        </PublicAccessBlockConfiguration>"#;
        assert_eq!(
            PublicAccessBlock::parse(doc).unwrap(),
            PublicAccessBlock {
                restrict_public_buckets: true,
                ..Default::default()
            }
        );
        let empty = PublicAccessBlock::parse("<PublicAccessBlockConfiguration/>").unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn a_boto3_body_parses() {
        // What botocore sends for put_public_access_block with all four set.
        let doc = r#"<?xml version="1.0" encoding="UTF-8"?>
<PublicAccessBlockConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><BlockPublicAcls>true</BlockPublicAcls><IgnorePublicAcls>true</IgnorePublicAcls><BlockPublicPolicy>true</BlockPublicPolicy><RestrictPublicBuckets>true</RestrictPublicBuckets></PublicAccessBlockConfiguration>"#;
        let c = PublicAccessBlock::parse(doc).unwrap();
        assert!(
            c.block_public_acls
                && c.ignore_public_acls
                && c.block_public_policy
                && c.restrict_public_buckets
        );
    }

    #[test]
    fn boolean_spellings() {
        let one = |v: &str| {
            PublicAccessBlock::parse(&format!(
                "<PublicAccessBlockConfiguration><BlockPublicPolicy>{v}</BlockPublicPolicy></PublicAccessBlockConfiguration>"
            ))
            .map(|c| c.block_public_policy)
        };
        assert_eq!(one("true"), Ok(true));
        assert_eq!(one(" TRUE "), Ok(true));
        assert_eq!(one("1"), Ok(true));
        assert_eq!(one("false"), Ok(false));
        assert_eq!(one("0"), Ok(false));
        let err = one("yes").unwrap_err();
        assert!(err.to_string().contains("BlockPublicPolicy"), "{err}");
        assert_eq!(err.s3_code(), S3ErrorCode::MalformedXML);
        assert!(one("").is_err());
    }

    #[test]
    fn malformed_documents_are_refused() {
        assert!(PublicAccessBlock::parse("<PublicAccessBlockConfiguration>").is_err());
        assert!(PublicAccessBlock::parse("").is_err());
        assert!(PublicAccessBlock::parse("not xml").is_err());
        // Another document than the one expected.
        assert!(PublicAccessBlock::parse(
            "<CORSConfiguration><BlockPublicAcls>true</BlockPublicAcls></CORSConfiguration>"
        )
        .is_err());
        let huge = format!(
            "<PublicAccessBlockConfiguration>{}</PublicAccessBlockConfiguration>",
            "<!-- padding -->".repeat(1000)
        );
        assert!(PublicAccessBlock::parse(&huge).is_err());
    }

    #[test]
    fn a_namespace_prefix_and_comments_are_fine() {
        let doc = r#"<?xml version="1.0"?><!-- note --><s3:PublicAccessBlockConfiguration xmlns:s3="http://s3.amazonaws.com/doc/2006-03-01/"><s3:IgnorePublicAcls>true</s3:IgnorePublicAcls></s3:PublicAccessBlockConfiguration>"#;
        assert_eq!(root_name(doc), Some("PublicAccessBlockConfiguration"));
        let c = PublicAccessBlock::parse(doc).unwrap();
        assert!(c.ignore_public_acls);
    }

    #[test]
    fn policy_status_round_trips() {
        let xml = PolicyStatus { is_public: true }.to_xml();
        assert!(
            xml.contains(r#"<PolicyStatus xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsPublic>true</IsPublic></PolicyStatus>"#),
            "{xml}"
        );
        assert_eq!(
            PolicyStatus::parse(&xml),
            Ok(PolicyStatus { is_public: true })
        );
        let xml = PolicyStatus { is_public: false }.to_xml();
        assert!(xml.contains("<IsPublic>false</IsPublic>"), "{xml}");
        assert_eq!(PolicyStatus::parse(&xml), Ok(PolicyStatus::default()));
        assert!(
            PolicyStatus::parse("<PolicyStatus><IsPublic>maybe</IsPublic></PolicyStatus>").is_err()
        );
        assert!(PolicyStatus::parse("<Other/>").is_err());
    }

    #[test]
    fn storage_form_is_json_of_the_fields() {
        let c = PublicAccessBlock {
            block_public_acls: true,
            ..Default::default()
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<PublicAccessBlock>(&json).unwrap(), c);
        assert_eq!(
            serde_json::from_str::<PublicAccessBlock>("{}").unwrap(),
            PublicAccessBlock::default()
        );
    }
}
