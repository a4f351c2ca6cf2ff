//! S3 access control lists: canned ACLs (`x-amz-acl`), grant headers (`x-amz-grant-*`), the
//! `AccessControlPolicy` document, and what a list of grants allows.
//!
//! The owner of a bucket (or object) always keeps full control, whatever its ACL lists (S3
//! keeps the owner's READ_ACP and WRITE_ACP at least; Yutu keeps all of it), so an ACL's
//! grants only ever add to what users' grants and token scopes allow; the server's one
//! permission check (`auth::policy::authorize`) consults them. What an ACL *lists* is S3's:
//! a canned ACL lists the owner's FULL_CONTROL and its grants, while a policy document or
//! `x-amz-grant-*` headers list exactly what they name, so that a client reading an ACL back
//! sees what it wrote, down to "revoke all" (no grant at all). Grantees are a user by
//! canonical id (Yutu's user or token subject name), every caller (`AllUsers`, anonymous
//! included) or every authenticated caller (`AuthenticatedUsers`).

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
    #[error("The grant {0:?} cannot be read: expected id=\"...\", uri=\"...\" or emailAddress=\"...\" items separated by commas.")]
    BadGrantHeader(String),
    #[error("Unknown group {0}: only AllUsers and AuthenticatedUsers are supported.")]
    UnknownGroup(String),
    #[error("A grantee names no ID, group URI or e-mail address.")]
    NoGrantee,
    /// A grantee named by e-mail (`AmazonCustomerByEmail`, `emailAddress=`): users carry no
    /// e-mail address here, so none resolves (S3: UnresolvableGrantByEmailAddress).
    #[error("The e-mail address {0} does not match any account on record.")]
    UnresolvableEmail(String),
    /// A grant to a canonical id that names no user (S3: InvalidArgument, "Invalid id"); the
    /// server checks ids against its users, this crate does not know them.
    #[error("Invalid id: {0} names no user.")]
    UnknownId(String),
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

/// An ACL: the grants, and whether the owner's FULL_CONTROL is listed with them.
///
/// Stored as a plain list of grants when the owner's FULL_CONTROL is implied (the form every
/// ACL had before exact lists existed, so older catalogs and records read unchanged), and as
/// `{"grants": [...], "exact": true}` otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "AclRepr", into = "AclRepr")]
pub struct Acl {
    /// The grants, groups first and then users (the order GetBucketAcl/GetObjectAcl list
    /// them in), each kind in the order its writer gave.
    pub grants: Vec<Grant>,
    /// `true`: `grants` is the whole list, as a policy document or grant headers that do not
    /// give the owner FULL_CONTROL set it (an empty one is S3's "revoke all"). `false`: the
    /// owner's FULL_CONTROL is implied and listed first among the users (canned ACLs, and
    /// documents or headers that list it, which it is then dropped from).
    pub exact: bool,
}

/// How an [`Acl`] is stored (see there).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AclRepr {
    Implied(Vec<Grant>),
    Exact { grants: Vec<Grant>, exact: bool },
}

impl From<AclRepr> for Acl {
    fn from(r: AclRepr) -> Acl {
        match r {
            AclRepr::Implied(grants) => Acl {
                grants,
                exact: false,
            },
            AclRepr::Exact { grants, exact } => Acl { grants, exact },
        }
    }
}

impl From<Acl> for AclRepr {
    fn from(a: Acl) -> AclRepr {
        if a.exact {
            AclRepr::Exact {
                grants: a.grants,
                exact: true,
            }
        } else {
            AclRepr::Implied(a.grants)
        }
    }
}

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
        Acl::implied(match canned {
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

    /// An ACL of `grants` beyond the owner's implied FULL_CONTROL.
    fn implied(grants: Vec<Grant>) -> Acl {
        Acl {
            grants: in_listing_order(grants),
            exact: false,
        }
    }

    /// The ACL a writer's list of grants sets on a resource of `owner`: exact, unless the
    /// list gives the owner FULL_CONTROL, which is then implied (so that the common document,
    /// GetAcl's answer with a grant added, is stored as it always was).
    fn from_grants(grants: Vec<Grant>, owner: &str) -> Acl {
        let is_owner_full = |g: &Grant| {
            g.permission == Permission::FullControl
                && matches!(&g.grantee, Grantee::User(u) if u == owner)
        };
        if grants.iter().any(is_owner_full) {
            Acl::implied(grants.into_iter().filter(|g| !is_owner_full(g)).collect())
        } else {
            Acl {
                grants: in_listing_order(grants),
                exact: true,
            }
        }
    }

    /// Whether this is the default ACL (private: the owner's FULL_CONTROL alone), which
    /// storage leaves out. An exact empty list ("revoke all") is not: it lists nothing.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty() && !self.exact
    }

    /// The canonical ids the grants name (the server checks they are users).
    pub fn user_ids(&self) -> impl Iterator<Item = &str> {
        self.grants.iter().filter_map(|g| match &g.grantee {
            Grantee::User(u) => Some(u.as_str()),
            _ => None,
        })
    }

    /// Whether the grants give `wanted` to `who`.
    pub fn allows(&self, who: Principal, wanted: Permission) -> bool {
        self.grants.iter().any(|g| {
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
            (None, false) => Ok(Some(Acl::from_grants(grants, owner))),
            (None, true) => Ok(None),
        }
    }

    /// The `AccessControlPolicy` document of this ACL on a resource owned by `owner`: groups
    /// first, then the owner's implied FULL_CONTROL, then the users granted (the order
    /// Ceph RGW lists them in, which clients written against it index into).
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
        let xml = |g: &Grant| XmlGrant {
            grantee: match &g.grantee {
                Grantee::User(u) => user(u),
                Grantee::AllUsers => group(ALL_USERS),
                Grantee::AuthenticatedUsers => group(AUTHENTICATED_USERS),
            },
            permission: g.permission.as_str().to_string(),
        };
        let (users, groups): (Vec<&Grant>, Vec<&Grant>) = self
            .grants
            .iter()
            .partition(|g| matches!(g.grantee, Grantee::User(_)));
        let mut grant: Vec<XmlGrant> = groups.into_iter().map(xml).collect();
        if !self.exact {
            grant.push(XmlGrant {
                grantee: user(owner),
                permission: Permission::FullControl.as_str().to_string(),
            });
        }
        grant.extend(users.into_iter().map(xml));
        AccessControlPolicy {
            xmlns: Some(S3_NS.to_string()),
            owner: Some(XmlOwner {
                id: Some(owner.to_string()),
                display_name: Some(owner.to_string()),
            }),
            access_control_list: XmlGrants { grant },
        }
    }

    /// The ACL an `AccessControlPolicy` document sets on a resource owned by `owner`: what it
    /// lists, exactly (see [`Acl::exact`]). Its `Owner` element is not read: an ACL cannot
    /// change who owns a resource, and S3 documents carry it only because GetAcl's answer
    /// does.
    pub fn from_policy(doc: &AccessControlPolicy, owner: &str) -> Result<Acl, AclError> {
        if doc.access_control_list.grant.len() > MAX_GRANTS {
            return Err(AclError::TooManyGrants);
        }
        let mut grants = Vec::new();
        for g in &doc.access_control_list.grant {
            let permission = Permission::parse(&g.permission)?;
            let text = |v: &Option<String>| {
                v.as_deref()
                    .map(str::trim)
                    .filter(|i| !i.is_empty())
                    .map(str::to_string)
            };
            let grantee = match (
                text(&g.grantee.id),
                text(&g.grantee.uri),
                text(&g.grantee.email),
            ) {
                (Some(id), _, _) => Grantee::User(id),
                (None, Some(uri), _) => group(&uri)?,
                (None, None, Some(email)) => return Err(AclError::UnresolvableEmail(email)),
                (None, None, None) => return Err(AclError::NoGrantee),
            };
            grants.push(Grant {
                grantee,
                permission,
            });
        }
        Ok(Acl::from_grants(grants, owner))
    }
}

/// Groups first, then users, each in the order given (a stable partition).
fn in_listing_order(grants: Vec<Grant>) -> Vec<Grant> {
    let (mut groups, users): (Vec<Grant>, Vec<Grant>) = grants
        .into_iter()
        .partition(|g| !matches!(g.grantee, Grantee::User(_)));
    groups.extend(users);
    groups
}

fn group(uri: &str) -> Result<Grantee, AclError> {
    match uri {
        ALL_USERS => Ok(Grantee::AllUsers),
        AUTHENTICATED_USERS => Ok(Grantee::AuthenticatedUsers),
        other => Err(AclError::UnknownGroup(other.to_string())),
    }
}

/// `id="name", uri="http://acs.amazonaws.com/groups/global/AllUsers"`, as the
/// `x-amz-grant-*` headers list grantees (`emailAddress="..."` is read, to be refused as
/// S3 refuses an address it cannot resolve).
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
            "emailaddress" => return Err(AclError::UnresolvableEmail(v.to_string())),
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

/// `<Owner>`: both fields optional on input, as clients that build a document by hand (or
/// from an answer without them) leave them out; the document's owner is never read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct XmlOwner {
    #[serde(rename = "ID", default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
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
    /// `<EmailAddress>` of an `AmazonCustomerByEmail` grantee.
    #[serde(
        rename = "EmailAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
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
        assert_eq!(acl.grants.len(), 3);
        // Grant headers list exactly what they name: the owner is not added.
        assert!(acl.exact);
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
        assert_eq!(
            Acl::from_headers(bad, "a", "a").unwrap_err(),
            AclError::UnresolvableEmail("x@y".into())
        );
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
            acl.grants,
            vec![Grant {
                grantee: Grantee::AuthenticatedUsers,
                permission: Permission::Read
            }]
        );
        assert!(!acl.exact, "the owner's FULL_CONTROL is listed: implied");
        assert!(parse_policy("<AccessControlPolicy>").is_err());
        let bad = doc.replace("READ<", "LOOK<");
        assert!(Acl::from_policy(&parse_policy(&bad).unwrap(), "alice").is_err());
    }

    fn policy(owner: &str, grants: &str) -> String {
        format!(
            r#"<AccessControlPolicy xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{owner}<AccessControlList>{grants}</AccessControlList></AccessControlPolicy>"#
        )
    }

    fn user_grant(id: &str, permission: &str) -> String {
        format!(
            r#"<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser"><ID>{id}</ID></Grantee><Permission>{permission}</Permission></Grant>"#
        )
    }

    /// What GetAcl lists is what PutAcl set: no grant at all ("revoke all"), or the owner with
    /// less than FULL_CONTROL, is listed as given, and parses back to the same ACL.
    #[test]
    fn exact_lists_are_listed_as_given() {
        let revoke = parse_policy(&policy("<Owner><ID>alice</ID></Owner>", "")).unwrap();
        let acl = Acl::from_policy(&revoke, "alice").unwrap();
        assert_eq!(
            acl,
            Acl {
                grants: vec![],
                exact: true
            }
        );
        assert!(!acl.is_empty(), "revoke-all must be stored");
        assert!(!acl.allows(Principal::User("bob"), Permission::Read));
        let listed = acl.to_policy("alice");
        assert!(listed.access_control_list.grant.is_empty());
        let xml = crate::xml::to_xml("AccessControlPolicy", &listed);
        assert_eq!(
            Acl::from_policy(&parse_policy(&xml).unwrap(), "alice").unwrap(),
            acl
        );

        // Neither Owner nor DisplayName is needed; the owner's READ alone is listed alone.
        let read_only = parse_policy(&policy("", &user_grant("alice", "READ"))).unwrap();
        let acl = Acl::from_policy(&read_only, "alice").unwrap();
        let listed = acl.to_policy("alice").access_control_list.grant;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].permission, "READ");
        assert_eq!(listed[0].grantee.id.as_deref(), Some("alice"));
    }

    /// Groups first, then the owner, then other users, whatever order the writer used.
    #[test]
    fn listings_put_groups_first() {
        let doc = policy(
            "<Owner><ID>alice</ID><DisplayName>alice</DisplayName></Owner>",
            &format!(
                r#"{}{}<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="Group"><URI>{ALL_USERS}</URI></Grantee><Permission>READ</Permission></Grant>"#,
                user_grant("bob", "WRITE"),
                user_grant("alice", "FULL_CONTROL"),
            ),
        );
        let acl = Acl::from_policy(&parse_policy(&doc).unwrap(), "alice").unwrap();
        assert!(!acl.exact);
        let order: Vec<(Option<String>, Option<String>, String)> = acl
            .to_policy("alice")
            .access_control_list
            .grant
            .into_iter()
            .map(|g| (g.grantee.uri, g.grantee.id, g.permission))
            .collect();
        assert_eq!(
            order,
            vec![
                (Some(ALL_USERS.to_string()), None, "READ".to_string()),
                (None, Some("alice".to_string()), "FULL_CONTROL".to_string()),
                (None, Some("bob".to_string()), "WRITE".to_string()),
            ]
        );
        let canned = Acl::canned(Canned::PublicReadWrite, "alice", "alice").to_policy("alice");
        let last = canned.access_control_list.grant.last().unwrap();
        assert_eq!(
            (last.grantee.id.as_deref(), last.permission.as_str()),
            (Some("alice"), "FULL_CONTROL")
        );
    }

    #[test]
    fn email_grantees_are_unresolvable() {
        let doc = policy(
            "",
            r#"<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="AmazonCustomerByEmail"><EmailAddress>x@example.com</EmailAddress></Grantee><Permission>READ</Permission></Grant>"#,
        );
        assert_eq!(
            Acl::from_policy(&parse_policy(&doc).unwrap(), "alice"),
            Err(AclError::UnresolvableEmail("x@example.com".into()))
        );
    }

    /// Implied ACLs are stored as the plain list they always were; exact ones as a map, and
    /// both read back.
    #[test]
    fn storage_keeps_the_old_form() {
        let public = Acl::canned(Canned::PublicRead, "a", "a");
        let json = serde_json::to_string(&public).unwrap();
        assert!(json.starts_with('['), "{json}");
        assert_eq!(serde_json::from_str::<Acl>(&json).unwrap(), public);
        let old = r#"[{"grantee":"all_users","permission":"READ"}]"#;
        assert_eq!(serde_json::from_str::<Acl>(old).unwrap(), public);
        let revoke = Acl {
            grants: vec![],
            exact: true,
        };
        let json = serde_json::to_string(&revoke).unwrap();
        assert_eq!(serde_json::from_str::<Acl>(&json).unwrap(), revoke);
    }
}
