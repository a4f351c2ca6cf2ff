//! The read-only HTTP query endpoints of Mooncake's master (`master_admin_service.cpp`), as a
//! Yutu node serves them, so that inference engines and routers pointed at a Yutu node as
//! their Mooncake "master" work unchanged.
//!
//! | call | answer |
//! |---|---|
//! | `GET` [`GET_ALL_SEGMENTS_PATH`] | 200 [`SEGMENTS_CONTENT_TYPE`]: one transfer-engine `host:port` per line, each ending in `\n` |
//! | `GET` [`QUERY_KEY_PATH`]`?key=K` | 200 [`QueryKeyResponse`]; 404 [`ErrorResponse`] on a miss |
//! | `GET` [`BATCH_QUERY_KEYS_PATH`]`?keys=K1,K2` | 200 [`BatchQueryResponse`]; 400 [`BatchError`] with no keys or more than [`crate::kv::MAX_BATCH`] |
//!
//! The JSON answers are [`JSON_CONTENT_TYPE`]. Every call takes an optional `bucket=` (Mooncake's
//! tenant; [`DEFAULT_BUCKET`] when absent). The field names and their order are Mooncake's
//! (`Replica` follows `YLT_REFL` in `allocator.h`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET`: the segments (nodes) of the store, as text.
pub const GET_ALL_SEGMENTS_PATH: &str = "/get_all_segments";
/// `GET ?key=`: the copies of one key.
pub const QUERY_KEY_PATH: &str = "/query_key";
/// `GET ?keys=k1,k2`: the copies of several keys.
pub const BATCH_QUERY_KEYS_PATH: &str = "/batch_query_keys";
/// The bucket queried when the request names none (Mooncake's default tenant).
pub const DEFAULT_BUCKET: &str = "default";
/// Content type of [`GET_ALL_SEGMENTS_PATH`]'s answer (Mooncake answers it as Prometheus text).
pub const SEGMENTS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";
/// Content type of the JSON answers.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// The protocol every copy is reported with.
pub const PROTOCOL_TCP: &str = "tcp";
/// Mooncake's `ErrorCode::OBJECT_NOT_FOUND`.
pub const OBJECT_NOT_FOUND_CODE: i32 = -704;
/// Its name, as the answers spell it.
pub const OBJECT_NOT_FOUND: &str = "OBJECT_NOT_FOUND";
/// Mooncake's `ErrorCode::INVALID_KEY`: a key Yutu cannot hold (empty, too long...).
pub const INVALID_KEY_CODE: i32 = -400;
pub const INVALID_KEY: &str = "INVALID_KEY";
/// Mooncake's `ErrorCode::RPC_FAIL`: an owner of the key could not be asked.
pub const RPC_FAIL_CODE: i32 = -900;
pub const RPC_FAIL: &str = "RPC_FAIL";
/// [`BatchError::error`] when `keys` is missing or empty (Mooncake's text).
pub const NO_KEYS: &str = "No keys provided. Use ?keys=key1,key2,...";

/// One copy of a key (Mooncake's memory replica descriptor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// The value's length in bytes.
    #[serde(rename = "size_")]
    pub size: u64,
    /// Always 0 on Yutu: a copy's address is only given out under a lease (KV `get`).
    #[serde(rename = "buffer_address_")]
    pub buffer_address: u64,
    /// [`PROTOCOL_TCP`].
    #[serde(rename = "protocol_")]
    pub protocol: String,
    /// The transfer-engine address (`host:port`) of the node holding the copy.
    #[serde(rename = "transport_endpoint_")]
    pub transport_endpoint: String,
}

/// `200` answer of [`QUERY_KEY_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryKeyResponse {
    pub success: bool,
    pub data: Vec<Replica>,
}

/// Error answer of [`QUERY_KEY_PATH`] (404, as Mooncake answers every error of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub success: bool,
    pub error_code: i32,
    pub error_message: String,
}

impl ErrorResponse {
    pub fn new(code: i32, name: &str) -> ErrorResponse {
        ErrorResponse {
            success: false,
            error_code: code,
            error_message: name.to_string(),
        }
    }
}

/// One key of a [`BatchQueryResponse`]: `values` when found, `error` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Replica>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl KeyResult {
    pub fn found(values: Vec<Replica>) -> KeyResult {
        KeyResult {
            ok: true,
            values: Some(values),
            error: None,
        }
    }

    pub fn failed(name: &str) -> KeyResult {
        KeyResult {
            ok: false,
            values: None,
            error: Some(name.to_string()),
        }
    }
}

/// `200` answer of [`BATCH_QUERY_KEYS_PATH`]: every distinct key asked, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchQueryResponse {
    pub success: bool,
    pub data: BTreeMap<String, KeyResult>,
}

/// `400` answer of [`BATCH_QUERY_KEYS_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchError {
    pub success: bool,
    pub error: String,
}

impl BatchError {
    pub fn new(error: impl Into<String>) -> BatchError {
        BatchError {
            success: false,
            error: error.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes_are_mooncakes() {
        let r = Replica {
            size: 4096,
            buffer_address: 0,
            protocol: PROTOCOL_TCP.into(),
            transport_endpoint: "10.0.0.5:12345".into(),
        };
        let q = QueryKeyResponse {
            success: true,
            data: vec![r.clone()],
        };
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"success":true,"data":[{"size_":4096,"buffer_address_":0,"protocol_":"tcp","transport_endpoint_":"10.0.0.5:12345"}]}"#
        );
        assert_eq!(
            serde_json::to_string(&ErrorResponse::new(OBJECT_NOT_FOUND_CODE, OBJECT_NOT_FOUND))
                .unwrap(),
            r#"{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}"#
        );
        let mut b = BatchQueryResponse {
            success: true,
            ..Default::default()
        };
        b.data
            .insert("k2".into(), KeyResult::failed(OBJECT_NOT_FOUND));
        b.data.insert("k1".into(), KeyResult::found(vec![r]));
        let text = serde_json::to_string(&b).unwrap();
        assert_eq!(
            text,
            r#"{"success":true,"data":{"k1":{"ok":true,"values":[{"size_":4096,"buffer_address_":0,"protocol_":"tcp","transport_endpoint_":"10.0.0.5:12345"}]},"k2":{"ok":false,"error":"OBJECT_NOT_FOUND"}}}"#
        );
        assert_eq!(
            serde_json::from_str::<BatchQueryResponse>(&text).unwrap(),
            b
        );
        assert_eq!(
            serde_json::to_string(&BatchError::new(NO_KEYS)).unwrap(),
            r#"{"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}"#
        );
    }

    #[test]
    fn the_paths_can_never_name_a_bucket() {
        // A path-style S3 URL `/NAME` names bucket NAME: these can't, so a bucket is never
        // shadowed by the endpoints.
        for path in [GET_ALL_SEGMENTS_PATH, QUERY_KEY_PATH, BATCH_QUERY_KEYS_PATH] {
            let name = path.trim_start_matches('/');
            assert!(crate::validate_bucket_name(name).is_err(), "{name}");
        }
    }
}
