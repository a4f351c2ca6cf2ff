//! The watch stream: the gateway answers `POST /v3/watch` with one JSON document per line,
//! `{"result":{"header":{...},"created":true,"events":[...],...}}`, for as long as the
//! connection lasts. The bytes arrive in chunks that need not end at a line's end; the
//! decoder keeps the unfinished line, up to a bound (a peer that never sends a newline must
//! not grow it without end).

use serde::Deserialize;

use crate::answer::{int, unb64, GatewayInt, RawHeader, RawKv};
use crate::EtcdError;

/// The longest line the decoder keeps: a watch response carries the changed keys of one
/// revision (values included), and Yutu's records are small.
pub const MAX_WATCH_LINE: usize = 4 << 20;

/// What changed a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change under the watched prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub key: Vec<u8>,
    /// The revision of the change.
    pub mod_revision: i64,
}

/// One document of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchResponse {
    /// The store's revision when the response was sent.
    pub revision: i64,
    /// The watch was just set up (the first document).
    pub created: bool,
    /// etcd ended the watch; with `compact_revision` set, because its start revision was
    /// compacted away (start again from there after a full read).
    pub canceled: bool,
    pub compact_revision: i64,
    pub cancel_reason: String,
    pub events: Vec<WatchEvent>,
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    /// Absent for PUT (the enum's default).
    #[serde(rename = "type", default)]
    kind: String,
    kv: Option<RawKv>,
}

#[derive(Debug, Deserialize)]
struct RawResult {
    header: Option<RawHeader>,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    compact_revision: Option<GatewayInt>,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default)]
    events: Vec<RawEvent>,
}

#[derive(Debug, Deserialize)]
struct RawDocument {
    result: Option<RawResult>,
    error: Option<serde_json::Value>,
}

/// Parses one line of the stream.
fn parse_line(line: &[u8]) -> Result<WatchResponse, EtcdError> {
    let doc: RawDocument =
        serde_json::from_slice(line).map_err(|e| EtcdError::Answer(e.to_string()))?;
    if let Some(e) = doc.error {
        return Err(EtcdError::WatchCanceled(format!("{e:.300}")));
    }
    let raw = doc
        .result
        .ok_or_else(|| EtcdError::Answer("a watch document without a result".into()))?;
    let events = raw
        .events
        .iter()
        .map(|e| {
            let kind = match e.kind.as_str() {
                "" | "PUT" => EventKind::Put,
                "DELETE" => EventKind::Delete,
                other => return Err(EtcdError::Answer(format!("event type {other:.40}"))),
            };
            let kv =
                e.kv.as_ref()
                    .ok_or_else(|| EtcdError::Answer("an event without its key".into()))?;
            Ok(WatchEvent {
                kind,
                key: unb64(&kv.key)?,
                mod_revision: int(&kv.mod_revision)?,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(WatchResponse {
        revision: match &raw.header {
            Some(h) => int(&h.revision)?,
            None => 0,
        },
        created: raw.created,
        canceled: raw.canceled,
        compact_revision: int(&raw.compact_revision)?,
        cancel_reason: raw.cancel_reason,
        events,
    })
}

/// Splits the stream's bytes into documents.
#[derive(Debug)]
pub struct WatchDecoder {
    /// The unfinished line.
    partial: Vec<u8>,
    max_line: usize,
}

impl Default for WatchDecoder {
    fn default() -> Self {
        WatchDecoder::new(MAX_WATCH_LINE)
    }
}

impl WatchDecoder {
    /// A decoder refusing lines longer than `max_line` bytes.
    pub fn new(max_line: usize) -> WatchDecoder {
        WatchDecoder {
            partial: Vec::new(),
            max_line,
        }
    }

    /// The documents completed by `chunk`, in order. An error (a line over the bound, or one
    /// that is not a watch document) ends the stream: the caller drops it and reads afresh.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<WatchResponse>, EtcdError> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.extend(&rest[..end])?;
            let line = std::mem::take(&mut self.partial);
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                out.push(parse_line(&line)?);
            }
            rest = &rest[end + 1..];
        }
        self.extend(rest)?;
        Ok(out)
    }

    fn extend(&mut self, bytes: &[u8]) -> Result<(), EtcdError> {
        if self.partial.len() + bytes.len() > self.max_line {
            self.partial.clear();
            return Err(EtcdError::Answer(format!(
                "a watch line over {} bytes",
                self.max_line
            )));
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: &str =
        r#"{"result":{"header":{"cluster_id":"1","revision":"10"},"created":true}}"#;

    fn put_doc(key: &str, rev: u32) -> String {
        use base64::Engine as _;
        let k = base64::engine::general_purpose::STANDARD.encode(key);
        format!(
            r#"{{"result":{{"header":{{"revision":"{rev}"}},"events":[{{"kv":{{"key":"{k}","value":"e30=","mod_revision":"{rev}"}}}},{{"type":"DELETE","kv":{{"key":"{k}","mod_revision":{rev}}}}}]}}}}"#
        )
    }

    #[test]
    fn documents_split_across_chunks_are_decoded_in_order() {
        let stream = format!(
            "{CREATED}\n{}\n\n{}\n",
            put_doc("/a", 11),
            put_doc("/b", 12)
        );
        // Every chunking of the stream, down to a byte at a time, decodes the same.
        for size in [1, 2, 7, 64, stream.len()] {
            let mut d = WatchDecoder::default();
            let mut got = Vec::new();
            for chunk in stream.as_bytes().chunks(size) {
                got.extend(d.push(chunk).expect("decodes"));
            }
            assert_eq!(got.len(), 3, "chunks of {size}");
            assert!(got[0].created && got[0].events.is_empty());
            assert_eq!(got[0].revision, 10);
            assert_eq!(got[1].events.len(), 2);
            assert_eq!(got[1].events[0].kind, EventKind::Put, "absent type is PUT");
            assert_eq!(got[1].events[0].key, b"/a");
            assert_eq!(got[1].events[1].kind, EventKind::Delete);
            assert_eq!(got[1].events[1].mod_revision, 11, "numbers or strings");
            assert_eq!(got[2].revision, 12);
        }
    }

    #[test]
    fn a_line_over_the_bound_is_refused() {
        let mut d = WatchDecoder::new(64);
        assert!(d.push(&[b' '; 60]).expect("fits").is_empty());
        let e = d.push(&[b'x'; 10]).expect_err("over the bound");
        assert_eq!(e.kind(), "answer");
        // Without a newline at all, too.
        let mut d = WatchDecoder::new(64);
        for _ in 0..6 {
            let _ = d.push(&[b'{'; 10]);
        }
        assert!(d.push(&[b'{'; 10]).is_err());
        assert!(d.partial.len() <= 64);
    }

    #[test]
    fn cancellations_errors_and_garbage() {
        let mut d = WatchDecoder::default();
        let c = d
            .push(b"{\"result\":{\"header\":{\"revision\":\"30\"},\"canceled\":true,\"compact_revision\":\"25\",\"cancel_reason\":\"compacted\"}}\n")
            .expect("decodes");
        assert!(c[0].canceled);
        assert_eq!(c[0].compact_revision, 25);
        let e = d
            .push(b"{\"error\":{\"grpc_code\":14,\"message\":\"unavailable\"}}\n")
            .expect_err("an error document");
        assert_eq!(e.kind(), "watch");
        for bad in [
            &b"nope\n"[..],
            b"{\"result\":{\"events\":[{\"kv\":{\"key\":\"%%%\"}}]}}\n",
            b"{\"result\":{\"events\":[{\"type\":\"X\",\"kv\":{\"key\":\"AA==\"}}]}}\n",
            b"{\"result\":{\"events\":[{}]}}\n",
            b"{\"result\":{\"header\":{\"revision\":\"ten\"}}}\n",
            b"{}\n",
        ] {
            let e = WatchDecoder::default().push(bad).expect_err("refused");
            assert_eq!(e.kind(), "answer", "{e}");
        }
    }
}
