//! The parsers of the gateway's answers. etcd's bytes are not trusted: whatever they are, a
//! parser returns an error rather than panicking, and fields etcd leaves out (proto3
//! defaults) read as 0, "", false or empty.

use base64::Engine as _;
use serde::Deserialize;

use crate::EtcdError;

/// One key read from etcd (raw bytes: etcd keys need not be UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The answer to a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeAnswer {
    /// The store's revision the read was served at.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// More keys matched than the read's limit: `kvs` is not the whole range.
    pub more: bool,
}

pub(crate) fn unb64(s: &str) -> Result<Vec<u8>, EtcdError> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| EtcdError::Answer(format!("bad base64: {e}")))
}

/// A gateway integer: a string of digits, or (leniently) a JSON number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum GatewayInt {
    Text(String),
    Number(i64),
}

impl GatewayInt {
    pub(crate) fn value(&self) -> Result<i64, EtcdError> {
        match self {
            GatewayInt::Number(n) => Ok(*n),
            GatewayInt::Text(s) => s
                .parse()
                .map_err(|_| EtcdError::Answer(format!("{s:?} is not an integer"))),
        }
    }
}

/// An optional gateway integer: absent is 0.
pub(crate) fn int(v: &Option<GatewayInt>) -> Result<i64, EtcdError> {
    v.as_ref().map_or(Ok(0), GatewayInt::value)
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawHeader {
    pub(crate) revision: Option<GatewayInt>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawKv {
    pub(crate) key: String,
    /// Absent for an empty value.
    #[serde(default)]
    value: String,
    pub(crate) mod_revision: Option<GatewayInt>,
}

impl RawKv {
    fn decode(&self) -> Result<KeyValue, EtcdError> {
        Ok(KeyValue {
            key: unb64(&self.key)?,
            value: unb64(&self.value)?,
        })
    }
}

#[derive(Debug, Deserialize)]
struct RawRange {
    header: Option<RawHeader>,
    /// Absent when nothing matched.
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default)]
    more: bool,
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, EtcdError> {
    serde_json::from_slice(body).map_err(|e| EtcdError::Answer(e.to_string()))
}

/// The header's revision; an answer without a header is not etcd's.
fn revision(header: Option<RawHeader>) -> Result<i64, EtcdError> {
    match header {
        Some(h) => int(&h.revision),
        None => Err(EtcdError::Answer("no header".into())),
    }
}

/// Parses the answer to a range read ([`crate::Call::range_prefix`], [`crate::Call::range_key`]).
pub fn parse_range(body: &[u8]) -> Result<RangeAnswer, EtcdError> {
    let raw: RawRange = json(body)?;
    let revision = revision(raw.header)?;
    let kvs = raw
        .kvs
        .iter()
        .map(RawKv::decode)
        .collect::<Result<_, _>>()?;
    Ok(RangeAnswer {
        revision,
        kvs,
        more: raw.more,
    })
}

#[derive(Debug, Deserialize)]
struct RawLease {
    #[serde(rename = "ID")]
    id: Option<GatewayInt>,
    #[serde(rename = "TTL")]
    ttl: Option<GatewayInt>,
    #[serde(default)]
    error: String,
}

/// The id of a granted lease.
pub fn parse_grant(body: &[u8]) -> Result<i64, EtcdError> {
    let raw: RawLease = json(body)?;
    match int(&raw.id)? {
        0 => Err(EtcdError::Answer(format!(
            "no lease granted: {:.200}",
            raw.error
        ))),
        id => Ok(id),
    }
}

/// A streaming answer's first document (the keep-alive answers newline-separated ones),
/// unwrapped from its `result`; a gateway `error` document is an error.
fn first_result(body: &[u8]) -> Result<serde_json::Value, EtcdError> {
    let line = body
        .split(|b| *b == b'\n')
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
        .unwrap_or(&[]);
    let mut v: serde_json::Value = json(line)?;
    if let Some(e) = v.get("error") {
        return Err(EtcdError::Answer(format!("{e:.300}")));
    }
    Ok(v.get_mut("result")
        .map(serde_json::Value::take)
        .unwrap_or(v))
}

/// The TTL a keep-alive renewed the lease for; `None` when the lease has expired (etcd
/// answers a TTL of 0, or leaves it out, for a lease it forgot).
pub fn parse_keep_alive(body: &[u8]) -> Result<Option<u64>, EtcdError> {
    let raw: RawLease = serde_json::from_value(first_result(body)?)
        .map_err(|e| EtcdError::Answer(e.to_string()))?;
    match int(&raw.ttl)? {
        ttl if ttl > 0 => Ok(Some(ttl as u64)),
        _ => Ok(None),
    }
}

#[derive(Debug, Deserialize)]
struct RawTxn {
    header: Option<RawHeader>,
    #[serde(default)]
    succeeded: bool,
}

/// Whether a transaction's comparison held (and its put was done).
pub fn parse_txn(body: &[u8]) -> Result<bool, EtcdError> {
    let raw: RawTxn = json(body)?;
    revision(raw.header)?;
    Ok(raw.succeeded)
}

#[derive(Debug, Deserialize)]
struct RawDelete {
    header: Option<RawHeader>,
    deleted: Option<GatewayInt>,
}

/// How many keys a delete removed.
pub fn parse_delete(body: &[u8]) -> Result<u64, EtcdError> {
    let raw: RawDelete = json(body)?;
    revision(raw.header)?;
    Ok(u64::try_from(int(&raw.deleted)?).unwrap_or(0))
}

#[derive(Debug, Deserialize)]
struct RawAck {
    header: Option<RawHeader>,
}

/// An answer with nothing in it but its header (put, revoke): its revision.
pub fn parse_ok(body: &[u8]) -> Result<i64, EtcdError> {
    let raw: RawAck = json(body)?;
    revision(raw.header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn range_answers_parse_with_string_or_number_integers() {
        let body = format!(
            r#"{{"header":{{"cluster_id":"1","revision":"42"}},"kvs":[{{"key":"{}","value":"{}","create_revision":"5","lease":"7"}},{{"key":"{}"}}],"count":"2"}}"#,
            b64(b"/yutu/c/members/a"),
            b64(b"{}"),
            b64(b"/yutu/c/members/\xff"),
        );
        let a = parse_range(body.as_bytes()).expect("parses");
        assert_eq!(a.revision, 42);
        assert!(!a.more);
        assert_eq!(a.kvs.len(), 2);
        assert_eq!(a.kvs[0].key, b"/yutu/c/members/a");
        assert_eq!(a.kvs[0].value, b"{}");
        assert_eq!(a.kvs[1].key, b"/yutu/c/members/\xff", "keys are bytes");
        assert!(a.kvs[1].value.is_empty(), "an absent value is empty");
        // Nothing matched: no kvs at all; numbers where strings are expected are accepted.
        let a = parse_range(br#"{"header":{"revision":7},"more":true}"#).expect("parses");
        assert_eq!((a.revision, a.kvs.len(), a.more), (7, 0, true));
        // A header without a revision is revision 0 (proto3 default).
        assert_eq!(parse_range(br#"{"header":{}}"#).map(|a| a.revision), Ok(0));
    }

    #[test]
    fn unreadable_answers_are_errors_not_panics() {
        for bad in [
            &b"not json"[..],
            br#"{"kvs":[]}"#,
            br#"{"header":{"revision":"x"}}"#,
            br#"{"header":{"revision":"1"},"kvs":[{"key":"%%%"}]}"#,
            br#"{"header":{"revision":"1"},"kvs":[{"key":"AA==","value":"!!"}]}"#,
            br#"{"header":{"revision":"1"},"kvs":[{"value":"AA=="}]}"#,
            br#"{"header":{"revision":"1"},"kvs":"no"}"#,
            br#"{"header":{"revision":1.5}}"#,
        ] {
            let e = parse_range(bad).expect_err("refused");
            assert_eq!(e.kind(), "answer", "{e}");
        }
    }

    #[test]
    fn lease_answers() {
        assert_eq!(
            parse_grant(br#"{"header":{"revision":"3"},"ID":"7587","TTL":"10"}"#),
            Ok(7587)
        );
        assert_eq!(parse_grant(br#"{"ID":12,"TTL":10}"#), Ok(12));
        assert!(parse_grant(br#"{"header":{},"error":"too many"}"#).is_err());
        // The keep-alive answers a stream of documents; the first counts.
        assert_eq!(
            parse_keep_alive(b"\n{\"result\":{\"ID\":\"1\",\"TTL\":\"9\"}}\n{\"result\":{}}\n"),
            Ok(Some(9))
        );
        assert_eq!(
            parse_keep_alive(br#"{"result":{"header":{"revision":"4"},"ID":"1"}}"#),
            Ok(None),
            "an expired lease has no TTL"
        );
        assert!(parse_keep_alive(br#"{"error":{"grpc_code":5,"message":"x"}}"#).is_err());
        assert!(parse_keep_alive(b"").is_err());
    }

    #[test]
    fn txn_delete_and_acks() {
        assert_eq!(
            parse_txn(br#"{"header":{"revision":"5"},"succeeded":true}"#),
            Ok(true)
        );
        assert_eq!(parse_txn(br#"{"header":{"revision":"5"}}"#), Ok(false));
        assert!(parse_txn(br#"{"succeeded":true}"#).is_err(), "no header");
        assert_eq!(
            parse_delete(br#"{"header":{"revision":"5"},"deleted":"1"}"#),
            Ok(1)
        );
        assert_eq!(parse_delete(br#"{"header":{"revision":"5"}}"#), Ok(0));
        assert_eq!(parse_ok(br#"{"header":{"revision":"8"}}"#), Ok(8));
        assert!(parse_ok(b"[]").is_err());
    }
}
