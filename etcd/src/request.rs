//! The requests: for each call, the gateway's path and its JSON body.

use base64::Engine as _;
use serde_json::{json, Value};

/// One call to the gateway: `POST path` with a JSON `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub path: &'static str,
    pub body: String,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The end of the range of keys starting with `prefix` (etcd's `range_end`): the prefix with
/// its last byte below 0xff incremented; `[0]` (to the end of the keyspace) if there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Call {
    fn new(path: &'static str, body: Value) -> Call {
        Call {
            path,
            body: body.to_string(),
        }
    }

    /// A new lease of `ttl_s` seconds (answer: [`crate::parse_grant`]).
    pub fn grant(ttl_s: u64) -> Call {
        Call::new("/v3/lease/grant", json!({ "TTL": ttl_s.to_string() }))
    }

    /// Renews a lease once (answer: [`crate::parse_keep_alive`]).
    pub fn keep_alive(lease: i64) -> Call {
        Call::new("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
    }

    /// Revokes a lease, deleting the keys attached to it (answer: [`crate::parse_ok`]).
    pub fn revoke(lease: i64) -> Call {
        Call::new("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
    }

    /// Writes `key`, attached to `lease` if given (answer: [`crate::parse_ok`]).
    pub fn put(key: &[u8], value: &[u8], lease: Option<i64>) -> Call {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        Call::new("/v3/kv/put", body)
    }

    /// Every key under `prefix`, at most `limit` of them (0: no limit) (answer:
    /// [`crate::parse_range`]).
    pub fn range_prefix(prefix: &[u8], limit: u64) -> Call {
        let mut body = json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) });
        if limit > 0 {
            body["limit"] = json!(limit.to_string());
        }
        Call::new("/v3/kv/range", body)
    }

    /// One key (answer: [`crate::parse_range`]).
    pub fn range_key(key: &[u8]) -> Call {
        Call::new("/v3/kv/range", json!({ "key": b64(key) }))
    }

    /// One transaction: the put `put` on `key` only if `compare` (one comparison, without
    /// its key) holds (answer: [`crate::parse_txn`]).
    fn put_if(key: &[u8], mut compare: Value, mut put: Value) -> Call {
        let k = b64(key);
        compare["key"] = json!(k);
        put["key"] = json!(k);
        Call::new(
            "/v3/kv/txn",
            json!({ "compare": [compare], "success": [{ "request_put": put }] }),
        )
    }

    /// Writes `key` only if it does not exist.
    pub fn create(key: &[u8], value: &[u8]) -> Call {
        let absent = json!({ "target": "CREATE", "create_revision": "0" });
        Call::put_if(key, absent, json!({ "value": b64(value) }))
    }

    /// Writes `key` attached to `lease` only if it does not exist.
    pub fn create_leased(key: &[u8], value: &[u8], lease: i64) -> Call {
        let absent = json!({ "target": "CREATE", "create_revision": "0" });
        let put = json!({ "value": b64(value), "lease": lease.to_string() });
        Call::put_if(key, absent, put)
    }

    /// Replaces `key`'s value only if it is still `old` (a key deleted meanwhile is not
    /// written again).
    pub fn replace(key: &[u8], old: &[u8], new: &[u8]) -> Call {
        let same = json!({ "target": "VALUE", "value": b64(old) });
        Call::put_if(key, same, json!({ "value": b64(new) }))
    }

    /// Deletes `key` (answer: [`crate::parse_delete`]).
    pub fn delete(key: &[u8]) -> Call {
        Call::new("/v3/kv/deleterange", json!({ "key": b64(key) }))
    }

    /// Watches every key under `prefix` from `start_revision` on (0: from now); the answer is
    /// a stream for [`crate::WatchDecoder`]. Only the revisions matter to Yutu (a change
    /// wakes a full read), so values are left out (`prev_kv` false).
    pub fn watch_prefix(prefix: &[u8], start_revision: i64) -> Call {
        let mut create = json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) });
        if start_revision > 0 {
            create["start_revision"] = json!(start_revision.to_string());
        }
        Call::new("/v3/watch", json!({ "create_request": create }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(c: &Call) -> Value {
        serde_json::from_str(&c.body).expect("json")
    }

    #[test]
    fn requests_carry_base64_keys_and_string_integers() {
        let c = Call::range_prefix(b"/yutu/c/", 10);
        assert_eq!(c.path, "/v3/kv/range");
        assert_eq!(
            body(&c),
            json!({"key": b64(b"/yutu/c/"), "range_end": b64(b"/yutu/c0"), "limit": "10"})
        );
        assert!(body(&Call::range_prefix(b"/p/", 0)).get("limit").is_none());
        let put = body(&Call::put(b"k", b"v", Some(7)));
        assert_eq!(
            put,
            json!({"key": b64(b"k"), "value": b64(b"v"), "lease": "7"})
        );
        let txn = body(&Call::create_leased(b"k", b"v", 9));
        assert_eq!(txn["compare"][0]["key"], b64(b"k"));
        assert_eq!(txn["compare"][0]["target"], "CREATE");
        assert_eq!(txn["success"][0]["request_put"]["lease"], "9");
        let w = body(&Call::watch_prefix(b"/yutu/c/", 42));
        assert_eq!(w["create_request"]["start_revision"], "42");
        assert_eq!(w["create_request"]["range_end"], b64(b"/yutu/c0"));
        assert_eq!(Call::watch_prefix(b"/", 0).path, "/v3/watch");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }
}
