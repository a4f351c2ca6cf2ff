//! A bucket's CORS configuration (`PUT /bucket?cors`): the `CORSConfiguration` document, its
//! limits, and which rule answers a browser's request.
//!
//! Browsers send a preflight `OPTIONS` (with `Origin`, `Access-Control-Request-Method` and
//! `Access-Control-Request-Headers`) before a cross-origin request that is not "simple", and an
//! `Origin` header on the request itself. The first rule whose origins, methods and headers
//! all match answers both, as in S3.

use serde::{Deserialize, Serialize};

/// Most rules one configuration may hold (S3's limit).
pub const MAX_RULES: usize = 100;
/// Largest `CORSConfiguration` document accepted (S3 allows 64 KiB).
pub const MAX_DOCUMENT: u64 = 64 * 1024;

/// The methods a rule may allow.
pub const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorsError {
    #[error("The XML you provided was not well-formed or did not validate against our published schema: {0}")]
    Malformed(String),
    #[error("A CORS configuration holds 1 to 100 rules.")]
    RuleCount,
    #[error("Found unsupported HTTP method in CORS config. Unsupported method is {0}")]
    Method(String),
    #[error("{0} can not have more than one wildcard.")]
    Wildcards(String),
    #[error("Every CORSRule needs at least one AllowedOrigin and one AllowedMethod.")]
    Incomplete,
}

/// One `<CORSRule>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CorsRule {
    #[serde(rename = "ID", default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub allowed_origin: Vec<String>,
    #[serde(default)]
    pub allowed_method: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_header: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_header: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<u32>,
}

/// `<CORSConfiguration>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CorsConfiguration {
    #[serde(rename = "@xmlns", default, skip_serializing_if = "Option::is_none")]
    pub xmlns: Option<String>,
    #[serde(rename = "CORSRule", default)]
    pub rules: Vec<CorsRule>,
}

/// `pattern` with at most one `*`, matched against `value` (case-sensitive for origins, as S3;
/// headers are compared lowercased by the caller).
fn wildcard(pattern: &str, value: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == value,
        Some((head, tail)) => {
            value.len() >= head.len() + tail.len()
                && value.starts_with(head)
                && value.ends_with(tail)
        }
    }
}

impl CorsConfiguration {
    /// Parses and validates a `PUT ?cors` body.
    pub fn parse(text: &str) -> Result<CorsConfiguration, CorsError> {
        let mut doc: CorsConfiguration =
            quick_xml::de::from_str(text).map_err(|e| CorsError::Malformed(e.to_string()))?;
        if doc.rules.is_empty() || doc.rules.len() > MAX_RULES {
            return Err(CorsError::RuleCount);
        }
        for rule in &mut doc.rules {
            // Empty and padded values are what an empty element reads as: normalised, so a
            // configuration reads back the same after it is rendered.
            let tidy = |v: &mut Vec<String>| {
                for s in v.iter_mut() {
                    *s = s.trim().to_string();
                }
                v.retain(|s| !s.is_empty());
            };
            tidy(&mut rule.allowed_origin);
            tidy(&mut rule.allowed_method);
            tidy(&mut rule.allowed_header);
            tidy(&mut rule.expose_header);
            rule.id = rule
                .id
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_string);
            if rule.allowed_origin.is_empty() || rule.allowed_method.is_empty() {
                return Err(CorsError::Incomplete);
            }
            for m in &rule.allowed_method {
                if !METHODS.contains(&m.as_str()) {
                    return Err(CorsError::Method(m.clone()));
                }
            }
            for o in rule.allowed_origin.iter().chain(&rule.allowed_header) {
                if o.matches('*').count() > 1 {
                    return Err(CorsError::Wildcards(o.clone()));
                }
            }
            for h in &mut rule.allowed_header {
                *h = h.trim().to_ascii_lowercase();
            }
        }
        doc.xmlns = None;
        Ok(doc)
    }

    /// The rule that allows `method` from `origin` with the request headers `headers`
    /// (lowercase names), if any.
    pub fn find(&self, origin: &str, method: &str, headers: &[String]) -> Option<&CorsRule> {
        self.rules.iter().find(|r| {
            r.allowed_origin.iter().any(|o| wildcard(o, origin))
                && r.allowed_method.iter().any(|m| m == method)
                && headers
                    .iter()
                    .all(|h| r.allowed_header.iter().any(|a| wildcard(a, h)))
        })
    }
}

impl CorsRule {
    /// The `Access-Control-Allow-Origin` value: `*` when the rule allows every origin (and
    /// so names none in particular), else the request's origin.
    pub fn allow_origin<'a>(&'a self, origin: &'a str) -> &'a str {
        if self.allowed_origin.iter().any(|o| o == "*") {
            "*"
        } else {
            origin
        }
    }
}

/// The header names of an `Access-Control-Request-Headers` value, lowercased.
pub fn request_headers(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
        <CORSRule><AllowedOrigin>http://*.example.com</AllowedOrigin><AllowedMethod>PUT</AllowedMethod>
          <AllowedMethod>POST</AllowedMethod><AllowedHeader>x-amz-*</AllowedHeader><AllowedHeader>Content-Type</AllowedHeader>
          <ExposeHeader>ETag</ExposeHeader><MaxAgeSeconds>600</MaxAgeSeconds></CORSRule>
        <CORSRule><ID>reads</ID><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule>
      </CORSConfiguration>"#;

    #[test]
    fn rules_match_origins_methods_and_headers() {
        let c = CorsConfiguration::parse(DOC).unwrap();
        let h = request_headers("Content-Type, X-Amz-Date");
        let r = c.find("http://app.example.com", "PUT", &h).unwrap();
        assert_eq!(r.max_age_seconds, Some(600));
        assert_eq!(
            r.allow_origin("http://app.example.com"),
            "http://app.example.com"
        );
        assert!(c.find("http://evil.com", "PUT", &h).is_none());
        assert!(c.find("http://app.example.com", "DELETE", &[]).is_none());
        assert!(c
            .find(
                "http://app.example.com",
                "PUT",
                &request_headers("authorization")
            )
            .is_none());
        let any = c.find("http://evil.com", "GET", &[]).unwrap();
        assert_eq!(any.id.as_deref(), Some("reads"));
        assert_eq!(any.allow_origin("http://evil.com"), "*");
        // Round trip through the XML a GET answers.
        let xml = crate::xml::to_xml("CORSConfiguration", &c);
        assert_eq!(CorsConfiguration::parse(&xml).unwrap(), c);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let rule = |body: &str| {
            CorsConfiguration::parse(&format!(
                "<CORSConfiguration><CORSRule>{body}</CORSRule></CORSConfiguration>"
            ))
        };
        assert_eq!(
            rule("<AllowedOrigin>*</AllowedOrigin><AllowedMethod>PATCH</AllowedMethod>"),
            Err(CorsError::Method("PATCH".into()))
        );
        assert!(matches!(
            rule("<AllowedOrigin>*.*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"),
            Err(CorsError::Wildcards(_))
        ));
        assert_eq!(
            rule("<AllowedMethod>GET</AllowedMethod>"),
            Err(CorsError::Incomplete)
        );
        assert_eq!(
            CorsConfiguration::parse("<CORSConfiguration/>"),
            Err(CorsError::RuleCount)
        );
        assert!(matches!(
            CorsConfiguration::parse("<CORSConfiguration><CORSRule>"),
            Err(CorsError::Malformed(_))
        ));
    }
}
