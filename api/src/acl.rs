//! S3 access control lists: canned ACLs (`x-amz-acl`), grant headers (`x-amz-grant-*`), the
//! `AccessControlPolicy` document, and what a list of grants allows.
//!
//! An ACL here is the grants *beyond* the owner's: the owner of a bucket (or object) always
//! has full control, as in S3, so `private` is the empty list. Grantees are a user by
//! canonical id (Yutu's user or token subject name), every caller (`AllUsers`, anonymous
//! included) or every authenticated caller (`AuthenticatedUsers`). Grants only ever add to
//! what users' grants and token scopes allow; the server's one permission check
//! (`auth::policy::authorize`) consults them.

use serde::{Deserialize, Serialize};

use crate::xml::S3_NS;

/// The group URI of every caller, anonymous ones included.
pub const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
/// The group URI of every caller that authenticated.
pub const AUTHENTICATED_USERS: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";
/// The request header naming a canned ACL.
pub const ACL_HEADER: &str = "x-amz-acl";
/// The request header naming the account a bucket must belong to.
pub const EXPECTED_OWNER_HEADER: &str = "x-amz-expected-bucket-owner";
/// Most grants one ACL may hold (S3's limit is 100).
pub const MAX_GRANTS: usize = 100;

/// Why an ACL in a request was refused; the text is what the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("{0} is not a canned ACL (private, public-read, public-read-write, authenticated-read, bucket-owner-read, bucket-owner-full-control).")]
    UnknownCanned(String),
    #[error("The grant {0:?} cannot be read: expected id=\"...\" or uri=\"...\" items separated by commas.")]
    BadGrantHeader(String),
    #[error("Unknown group {0}: only AllUsers and AuthenticatedUsers are supported.")]
    UnknownGroup(String),
    #[error("A grantee names neither an ID nor a group URI (e-mail grantees are not supported).")]
    NoGrantee,
    #[error("{0} is not a permission (FULL_CONTROL, READ, WRITE, READ_ACP, WRITE_ACP).")]
    UnknownPermission(String),
    #[error("An ACL holds at most 100 grants.")]
    TooManyGrants,
    #[error("Specify either a canned ACL, x-amz-grant-* headers, or an AccessControlPolicy document, not several.")]
    Ambiguous,
    #[error("The XML you provided was not well-formed or did not validate against our published schema: {0}")]
    Malformed(String),
}

/// A permission S3 grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Permission {
    /// Bucket: list its objects. Object: read it.
    Read,
    /// Bucket: write and delete its objects. (Meaningless on an object.)
    Write,
    /// Read the ACL.
    ReadAcp,
    /// Change the ACL.
    WriteAcp,
    /// All of the above.
    FullControl,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "READ",
            Permission::Write => "WRITE",
            Permission::ReadAcp => "READ_ACP",
            Permission::WriteAcp => "WRITE_ACP",
            Permission::FullControl => "FULL_CONTROL",
        }
    }

    pub fn parse(s: &str) -> Result<Permission, AclError> {
        Ok(match s.trim() {
            "READ" => Permission::Read,
            "WRITE" => Permission::Write,
            "READ_ACP" => Permission::ReadAcp,
            "WRITE_ACP" => Permission::WriteAcp,
            "FULL_CONTROL" => Permission::FullControl,
            other => return Err(AclError::UnknownPermission(other.to_string())),
        })
    }

    /// Whether holding `self` gives `wanted`.
    pub fn covers(self, wanted: Permission) -> bool {
        self == Permission::FullControl || self == wanted
    }
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grantee {
    /// A user or token subject, by name (S3's canonical id).
    User(String),
    AllUsers,
    AuthenticatedUsers,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub grantee: Grantee,
    pub permission: Permission,
}

/// Grants beyond the owner's full control.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Acl(pub Vec<Grant>);

/// A caller, as grants see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal<'a> {
    /// No credentials.
    Anonymous,
    /// Authenticated, but by no name a grant can name (a bearer token: what it may do is
    /// its scopes, plus grants to everyone or to every authenticated caller).
    Authenticated,
    /// A user, by name.
    User(&'a str),
}

/// The canned ACLs of `x-amz-acl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canned {
    Private,
    PublicRead,
    PublicReadWrite,
    AuthenticatedRead,
    BucketOwnerRead,
    BucketOwnerFullControl,
}

impl Canned {
    pub fn parse(s: &str) -> Result<Canned, AclError> {
        Ok(match s.trim() {
            "private" => Canned::Private,
            "public-read" => Canned::PublicRead,
            "public-read-write" => Canned::PublicReadWrite,
            "authenticated-read" => Canned::AuthenticatedRead,
            "bucket-owner-read" => Canned::BucketOwnerRead,
            "bucket-owner-full-control" => Canned::BucketOwnerFullControl,
            other => return Err(AclError::UnknownCanned(other.to_string())),
        })
    }
}

impl Acl {
    /// The grants of a canned ACL set by `owner` on a resource; `bucket_owner` is the owner of
    /// the bucket an object is in (for the `bucket-owner-*` ACLs; on a bucket they add
    /// nothing, as in S3).
    pub fn canned(canned: Canned, owner: &str, bucket_owner: &str) -> Acl {
        let g = |grantee: Grantee, permission: Permission| Grant {
            grantee,
            permission,
        };
        let other_owner = (bucket_owner != owner).then(|| Grantee::User(bucket_owner.to_string()));
        Acl(match canned {
            Canned::Private => vec![],
            Canned::PublicRead => vec![g(Grantee::AllUsers, Permission::Read)],
            Canned::PublicReadWrite => vec![
                g(Grantee::AllUsers, Permission::Read),
                g(Grantee::AllUsers, Permission::Write),
            ],
            Canned::AuthenticatedRead => vec![g(Grantee::AuthenticatedUsers, Permission::Read)],
            Canned::BucketOwnerRead => other_owner
                .map(|o| g(o, Permission::Read))
                .into_iter()
                .collect(),
            Canned::BucketOwnerFullControl => other_owner
                .map(|o| g(o, Permission::FullControl))
                .into_iter()
                .collect(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the grants give `wanted` to `who`.
    pub fn allows(&self, who: Principal, wanted: Permission) -> bool {
        self.0.iter().any(|g| {
            g.permission.covers(wanted)
                && match (&g.grantee, who) {
                    (Grantee::AllUsers, _) => true,
                    (Grantee::AuthenticatedUsers, p) => p != Principal::Anonymous,
                    (Grantee::User(u), Principal::User(n)) => u == n,
                    (Grantee::User(_), _) => false,
                }
        })
    }

    /// The ACL a request sets: its canned `x-amz-acl`, or its `x-amz-grant-*` headers, or
    /// neither (`None`). `header` looks a request header up by lowercase name.
    pub fn from_headers<'a>(
        header: impl Fn(&str) -> Option<&'a str>,
        owner: &str,
        bucket_owner: &str,
    ) -> Result<Option<Acl>, AclError> {
        let canned = header(ACL_HEADER);
        let mut grants = Vec::new();
        for (name, permission) in [
            ("x-amz-grant-read", Permission::Read),
            ("x-amz-grant-write", Permission::Write),
            ("x-amz-grant-read-acp", Permission::ReadAcp),
            ("x-amz-grant-write-acp", Permission::WriteAcp),
            ("x-amz-grant-full-control", Permission::FullControl),
        ] {
            if let Some(v) = header(name) {
                for grantee in parse_grantees(v)? {
                    grants.push(Grant {
                        grantee,
                        permission,
                    });
                }
            }
        }
        match (canned, grants.is_empty()) {
            (Some(_), false) => Err(AclError::Ambiguous),
            (Some(c), true) => Ok(Some(Acl::canned(Canned::parse(c)?, owner, bucket_owner))),
            (None, false) if grants.len() > MAX_GRANTS => Err(AclError::TooManyGrants),
            (None, false) => Ok(Some(Acl(grants))),
            (None, true) => Ok(None),
        }
    }

    /// The `AccessControlPolicy` document of this ACL on a resource owned by `owner`.
    pub fn to_policy(&self, owner: &str) -> AccessControlPolicy {
        let user = |id: &str| XmlGrantee {
            xmlns_xsi: Some(XSI.to_string()),
            xsi_type: Some("CanonicalUser".to_string()),
            id: Some(id.to_string()),
            display_name: Some(id.to_string()),
            uri: None,
            email: None,
        };
        let group = |uri: &str| XmlGrantee {
            xmlns_xsi: Some(XSI.to_string()),
            xsi_type: Some("Group".to_string()),
            id: None,
            display_name: None,
            uri: Some(uri.to_string()),
            email: None,
        };
        let mut grant = vec![XmlGrant {
            grantee: user(owner),
            permission: Permission::FullControl.as_str().to_string(),
        }];
        grant.extend(self.0.iter().map(|g| XmlGrant {
            grantee: match &g.grantee {
                Grantee::User(u) => user(u),
                Grantee::AllUsers => group(ALL_USERS),
                Grantee::AuthenticatedUsers => group(AUTHENTICATED_USERS),
            },
            permission: g.permission.as_str().to_string(),
        }));
        AccessControlPolicy {
            xmlns: Some(S3_NS.to_string()),
            owner: Some(XmlOwner {
                id: owner.to_string(),
                display_name: Some(owner.to_string()),
            }),
            access_control_list: XmlGrants { grant },
        }
    }

    /// The ACL an `AccessControlPolicy` document sets on a resource owned by `owner` (the
    /// owner's own full-control grant is implied and dropped).
    pub fn from_policy(doc: &AccessControlPolicy, owner: &str) -> Result<Acl, AclError> {
        if doc.access_control_list.grant.len() > MAX_GRANTS {
            return Err(AclError::TooManyGrants);
        }
        let mut grants = Vec::new();
        for g in &doc.access_control_list.grant {
            let permission = Permission::parse(&g.permission)?;
            let id = g
                .grantee
                .id
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty());
            let uri = g
                .grantee
                .uri
                .as_deref()
                .map(str::trim)
                .filter(|u| !u.is_empty());
            let grantee = match (id, uri) {
                (Some(id), _) => Grantee::User(id.to_string()),
                (None, Some(uri)) => group(uri)?,
                (None, None) => return Err(AclError::NoGrantee),
            };
            if grantee == Grantee::User(owner.to_string()) && permission == Permission::FullControl
            {
                continue;
            }
            grants.push(Grant {
                grantee,
                permission,
            });
        }
        Ok(Acl(grants))
    }
}

fn group(uri: &str) -> Result<Grantee, AclError> {
    match uri {
        ALL_USERS => Ok(Grantee::AllUsers),
        AUTHENTICATED_USERS => Ok(Grantee::AuthenticatedUsers),
        other => Err(AclError::UnknownGroup(other.to_string())),
    }
}

/// `id="name", uri="http://acs.amazonaws.com/groups/global/AllUsers"`, as the
/// `x-amz-grant-*` headers list grantees.
fn parse_grantees(value: &str) -> Result<Vec<Grantee>, AclError> {
    let bad = || AclError::BadGrantHeader(value.chars().take(200).collect());
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, rest) = item.split_once('=').ok_or_else(bad)?;
        let v = rest.trim().trim_matches('"');
        if v.is_empty() {
            return Err(bad());
        }
        out.push(match kind.trim().to_ascii_lowercase().as_str() {
            "id" => Grantee::User(v.to_string()),
            "uri" => group(v)?,
            _ => return Err(bad()),
        });
        if out.len() > MAX_GRANTS {
            return Err(AclError::TooManyGrants);
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

const XSI: &str = "http://www.w3.org/2001/XMLSchema-instance";

/// `<AccessControlPolicy>`: GetBucketAcl/GetObjectAcl's answer, PutBucketAcl/PutObjectAcl's
/// body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AccessControlPolicy {
    #[serde(rename = "@xmlns", default, skip_serializing_if = "Option::is_none")]
    pub xmlns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<XmlOwner>,
    pub access_control_list: XmlGrants,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct XmlOwner {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct XmlGrants {
    #[serde(default)]
    pub grant: Vec<XmlGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct XmlGrant {
    pub grantee: XmlGrantee,
    pub permission: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct XmlGrantee {
    #[serde(
        rename = "@xmlns:xsi",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub xmlns_xsi: Option<String>,
    #[serde(rename = "@xsi:type", default, skip_serializing_if = "Option::is_none")]
    pub xsi_type: Option<String>,
    #[serde(rename = "ID", default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(rename = "URI", default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

/// Parses an `AccessControlPolicy` body.
pub fn parse_policy(text: &str) -> Result<AccessControlPolicy, AclError> {
    quick_xml::de::from_str(text).map_err(|e| AclError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canned_acls_grant_what_s3_says() {
        let public = Acl::canned(Canned::PublicRead, "alice", "alice");
        assert!(public.allows(Principal::Anonymous, Permission::Read));
        assert!(!public.allows(Principal::Anonymous, Permission::Write));
        assert!(!public.allows(Principal::Anonymous, Permission::ReadAcp));
        let rw = Acl::canned(Canned::PublicReadWrite, "alice", "alice");
        assert!(
            rw.allows(Principal::Anonymous, Permission::Write)
                && rw.allows(Principal::User("bob"), Permission::Read)
        );
        let auth = Acl::canned(Canned::AuthenticatedRead, "alice", "alice");
        assert!(
            auth.allows(Principal::User("bob"), Permission::Read)
                && !auth.allows(Principal::Anonymous, Permission::Read)
        );
        assert!(Acl::canned(Canned::Private, "a", "a").is_empty());
        let bor = Acl::canned(Canned::BucketOwnerRead, "bob", "alice");
        assert!(bor.allows(Principal::User("alice"), Permission::Read));
        assert!(!bor.allows(Principal::User("alice"), Permission::WriteAcp));
        // A token is an authenticated caller with no name a grant can match.
        assert!(auth.allows(Principal::Authenticated, Permission::Read));
        assert!(!bor.allows(Principal::Authenticated, Permission::Read));
        let bofc = Acl::canned(Canned::BucketOwnerFullControl, "bob", "alice");
        assert!(bofc.allows(Principal::User("alice"), Permission::WriteAcp));
        assert!(Acl::canned(Canned::BucketOwnerFullControl, "a", "a").is_empty());
        assert!(matches!(
            Canned::parse("public"),
            Err(AclError::UnknownCanned(_))
        ));
    }

    #[test]
    fn grant_headers_and_policies_round_trip() {
        let headers = [
            (
                "x-amz-grant-read",
                r#"uri="http://acs.amazonaws.com/groups/global/AllUsers""#,
            ),
            ("x-amz-grant-write-acp", r#"id="bob", id="carol""#),
        ];
        let get = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let acl = Acl::from_headers(get, "alice", "alice").unwrap().unwrap();
        assert_eq!(acl.0.len(), 3);
        assert!(acl.allows(Principal::Anonymous, Permission::Read));
        assert!(acl.allows(Principal::User("carol"), Permission::WriteAcp));
        let xml = crate::xml::to_xml("AccessControlPolicy", &acl.to_policy("alice"));
        assert!(xml.contains("xsi:type=\"Group\""), "{xml}");
        let back = Acl::from_policy(&parse_policy(&xml).unwrap(), "alice").unwrap();
        assert_eq!(back, acl);
        let both = |n: &str| match n {
            "x-amz-acl" => Some("private"),
            "x-amz-grant-read" => Some("id=\"x\""),
            _ => None,
        };
        assert_eq!(
            Acl::from_headers(both, "a", "a").unwrap_err(),
            AclError::Ambiguous
        );
        let bad = |n: &str| (n == "x-amz-grant-read").then_some("emailAddress=\"x@y\"");
        assert!(Acl::from_headers(bad, "a", "a").is_err());
        let bad = |n: &str| (n == "x-amz-grant-read").then_some("uri=\"http://other/group\"");
        assert!(matches!(
            Acl::from_headers(bad, "a", "a"),
            Err(AclError::UnknownGroup(_))
        ));
    }

    #[test]
    fn a_boto3_policy_parses() {
        let doc = r#"<AccessControlPolicy xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><AccessControlList><Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="Group"><URI>http://acs.amazonaws.com/groups/global/AuthenticatedUsers</URI></Grantee><Permission>READ</Permission></Grant><Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser"><ID>alice</ID></Grantee><Permission>FULL_CONTROL</Permission></Grant></AccessControlList><Owner><ID>alice</ID></Owner></AccessControlPolicy>"#;
        let acl = Acl::from_policy(&parse_policy(doc).unwrap(), "alice").unwrap();
        assert_eq!(
            acl.0,
            vec![Grant {
                grantee: Grantee::AuthenticatedUsers,
                permission: Permission::Read
            }]
        );
        assert!(parse_policy("<AccessControlPolicy>").is_err());
        let bad = doc.replace("READ<", "LOOK<");
        assert!(Acl::from_policy(&parse_policy(&bad).unwrap(), "alice").is_err());
    }
}
