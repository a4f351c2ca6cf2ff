//! The conductor's routing API: what a request router asks (`POST /v1/route`), what it gets
//! back (a [`RouteDecision`], or a [`Reject`] with HTTP 429), and how the prefill and decode
//! instances it routes to make themselves known (`POST /v1/instances`, load reports).
//!
//! A route request names the prompt's prefix by its block hashes (computed by the caller with
//! [`crate::block_hash::BlockHasher`]), by its token ids (the conductor hashes them with its
//! configured block size), or by the keys an inference engine stores its blocks under through
//! the KV API, in chain order (the conductor maps each to its id with
//! [`BlockHash::of_key`], as the storage nodes do when they publish them):
//!
//! ```json
//! {"bucket": "llama3-70b", "block_hashes": ["<64 hex>", "..."], "input_length": 8000,
//!  "output_length": 200, "slo": {"ttft_ms": 2000, "tbt_ms": 80}}
//! {"bucket": "llama3-70b", "block_keys": ["9f3a..._0_k", "51c2..._0_k"], "input_length": 1100}
//! ```
//!
//! The decision names the prefill instance (and the storage node whose cache it reads), the
//! decode instance, how many leading blocks are already cached there, and, when fetching a
//! longer prefix from another node beats recomputing it, which node to pull which blocks from.

use serde::{Deserialize, Serialize};

use crate::block_hash::{BlockHash, BlockHasher};
use crate::bucket::{validate_bucket_name, BucketNameError};
use crate::events::Tier;
use crate::key::{validate_object_key, KeyError};

/// `POST`: route one request.
pub const ROUTE_PATH: &str = "/v1/route";

/// The longest prompt a route request may describe, in tokens. Far above any context window;
/// it only bounds the work one request can cause.
pub const MAX_INPUT_TOKENS: u64 = 1 << 24;

/// The longest request id and instance id accepted (they are echoed and used as labels).
pub const MAX_ID_LEN: usize = 256;

/// A request to place one LLM request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteRequest {
    /// Echoed in the decision, for the caller's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The bucket the model's KV blocks are stored in (one per model).
    pub bucket: String,
    /// Hashes of the prompt's full blocks, in order. Give one of `block_hashes`, `block_keys`
    /// and `token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_hashes: Option<Vec<BlockHash>>,
    /// The object keys the engine stores the prompt's full blocks under (SGLang, vLLM,
    /// LMCache keys, or Yutu's own hex keys), in chain order: one key per block, e.g. the
    /// `tp_rank` 0 key of each SGLang page. Each is mapped to [`BlockHash::of_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_keys: Option<Vec<String>>,
    /// The prompt's token ids; the conductor hashes their full blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// Prompt tokens. Required with `block_hashes` unless the prompt is exactly those blocks;
    /// must equal `token_ids.len()` when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_length: Option<u64>,
    /// Expected output tokens (e.g. `max_tokens`, or a prediction); the conductor's default
    /// when absent. Used to predict how long the request occupies its decode instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_length: Option<u64>,
    /// This request's service-level objectives; the conductor's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<Slo>,
    /// Decide, but record nothing (no load, no predicted cache entries): for inspection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// Service-level objectives: time to first token and time between tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbt_ms: Option<f64>,
}

/// Why a route request is malformed (HTTP 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteRequestError {
    #[error("bucket: {0}")]
    Bucket(#[from] BucketNameError),
    #[error("give only one of block_hashes, block_keys and token_ids")]
    BothPrefixForms,
    #[error("give block_hashes, block_keys, token_ids or at least input_length")]
    NoInput,
    #[error("block_keys[{index}]: {source}")]
    BlockKey { index: usize, source: KeyError },
    #[error(
        "input_length {input} is shorter than the {blocks} blocks of {block_tokens} tokens given"
    )]
    InputShorterThanBlocks {
        input: u64,
        blocks: usize,
        block_tokens: usize,
    },
    #[error("input_length {input} differs from the {tokens} token_ids given")]
    InputLengthMismatch { input: u64, tokens: usize },
    #[error("input_length must be between 1 and {MAX_INPUT_TOKENS}")]
    InputLength,
    #[error("{0} must be a positive finite number of milliseconds")]
    Slo(&'static str),
    #[error("request_id is longer than {MAX_ID_LEN} bytes")]
    RequestId,
}

/// A route request reduced to what routing needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedPrompt {
    pub blocks: Vec<BlockHash>,
    pub input_tokens: u64,
}

impl RouteRequest {
    /// Validates the request and turns it into block hashes and a prompt length, hashing
    /// `token_ids` with `hasher` when those were given.
    pub fn resolve(&self, hasher: &BlockHasher) -> Result<ResolvedPrompt, RouteRequestError> {
        validate_bucket_name(&self.bucket)?;
        if self
            .request_id
            .as_ref()
            .is_some_and(|r| r.len() > MAX_ID_LEN)
        {
            return Err(RouteRequestError::RequestId);
        }
        if let Some(slo) = &self.slo {
            for (name, v) in [("slo.ttft_ms", slo.ttft_ms), ("slo.tbt_ms", slo.tbt_ms)] {
                if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                    return Err(RouteRequestError::Slo(name));
                }
            }
        }
        let bt = hasher.block_tokens.max(1);
        let forms = [
            self.block_hashes.is_some(),
            self.block_keys.is_some(),
            self.token_ids.is_some(),
        ];
        if forms.iter().filter(|f| **f).count() > 1 {
            return Err(RouteRequestError::BothPrefixForms);
        }
        let from_keys;
        let block_hashes = match &self.block_keys {
            Some(keys) => {
                let mut ids = Vec::with_capacity(keys.len());
                for (index, key) in keys.iter().enumerate() {
                    validate_object_key(key)
                        .map_err(|source| RouteRequestError::BlockKey { index, source })?;
                    ids.push(BlockHash::of_key(key));
                }
                from_keys = Some(ids);
                &from_keys
            }
            None => &self.block_hashes,
        };
        let resolved = match (block_hashes, &self.token_ids) {
            (Some(_), Some(_)) => return Err(RouteRequestError::BothPrefixForms),
            (None, Some(tokens)) => {
                if let Some(input) = self.input_length {
                    if input != tokens.len() as u64 {
                        return Err(RouteRequestError::InputLengthMismatch {
                            input,
                            tokens: tokens.len(),
                        });
                    }
                }
                ResolvedPrompt {
                    blocks: hasher.hash_tokens(tokens),
                    input_tokens: tokens.len() as u64,
                }
            }
            (Some(blocks), None) => {
                let covered = blocks.len() as u64 * bt as u64;
                let input = self.input_length.unwrap_or(covered);
                if input < covered {
                    return Err(RouteRequestError::InputShorterThanBlocks {
                        input,
                        blocks: blocks.len(),
                        block_tokens: bt,
                    });
                }
                ResolvedPrompt {
                    blocks: blocks.clone(),
                    input_tokens: input,
                }
            }
            (None, None) => match self.input_length {
                Some(input) => ResolvedPrompt {
                    blocks: Vec::new(),
                    input_tokens: input,
                },
                None => return Err(RouteRequestError::NoInput),
            },
        };
        if resolved.input_tokens == 0 || resolved.input_tokens > MAX_INPUT_TOKENS {
            return Err(RouteRequestError::InputLength);
        }
        Ok(resolved)
    }
}

/// Where a request goes: an instance and the storage node whose cache it reads and fills.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub instance: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Blocks the prefill instance should read from another node before computing the rest,
/// because the transfer is predicted to be faster than recomputing them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    pub from_node: String,
    /// The node's base URL, when registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_url: Option<String>,
    /// Index (0-based) of the first block to pull; blocks before it are already local.
    pub first_block: u32,
    /// How many blocks to pull, from `first_block` on.
    pub blocks: u32,
    /// The slowest tier the source serves any of them from.
    pub tier: Tier,
}

/// The conductor's predictions for an accepted request, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Waiting behind work already routed to the prefill instance.
    pub queue_ms: f64,
    /// Loading cached blocks: the pull, and local blocks held on NVMe.
    pub transfer_ms: f64,
    /// Computing the uncached part of the prompt.
    pub prefill_ms: f64,
    /// `queue + transfer + prefill`.
    pub ttft_ms: f64,
    /// Time between tokens on the decode instance when the request arrives there.
    pub tbt_ms: f64,
    /// Requests the decode instance is predicted to run at that time, this one included.
    pub decode_batch: u32,
}

/// Copy a hot prefix to a lightly loaded node so that later requests sharing it can be
/// served there instead of queueing behind its only holders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationHint {
    pub bucket: String,
    pub from_node: String,
    pub to_node: String,
    /// The blocks to copy, in chain order.
    pub blocks: Vec<BlockHash>,
}

/// An accepted request's placement (HTTP 200).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteDecision {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The policy that decided (`global-cache-aware` unless configured otherwise).
    pub policy: String,
    pub prefill: Placement,
    pub decode: Placement,
    /// Full blocks in the prompt.
    pub blocks: u32,
    /// Leading blocks already on (or predicted soon on) the prefill instance's node.
    pub cached_blocks: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<Pull>,
    pub predicted: Prediction,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicate: Vec<ReplicationHint>,
}

/// Why a request was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// Predicted time to first token exceeds the SLO on every prefill instance.
    TtftSlo,
    /// Predicted time between tokens, at the time the request would reach decode, exceeds
    /// the SLO on every decode instance.
    TbtSlo,
    /// No live prefill instance is registered.
    NoPrefillInstance,
    /// No live decode instance is registered.
    NoDecodeInstance,
}

impl RejectReason {
    /// 429 for SLO misses (the client may retry later or elsewhere), 503 when nothing could
    /// serve the request at all.
    pub fn status(self) -> u16 {
        match self {
            RejectReason::TtftSlo | RejectReason::TbtSlo => 429,
            RejectReason::NoPrefillInstance | RejectReason::NoDecodeInstance => 503,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::TtftSlo => "ttft_slo",
            RejectReason::TbtSlo => "tbt_slo",
            RejectReason::NoPrefillInstance => "no_prefill_instance",
            RejectReason::NoDecodeInstance => "no_decode_instance",
        }
    }
}

/// A refused request (HTTP 429 or 503), with the predictions that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    pub reason: RejectReason,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_tbt_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_slo_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbt_slo_ms: Option<f64>,
}

/// What an instance does in disaggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
}

/// `POST /v1/instances`: an inference instance joins (or re-joins; registering again updates
/// it and keeps its load).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRegistration {
    pub id: String,
    pub role: Role,
    /// The storage node whose cache the instance reads and fills. Required for prefill
    /// instances (it is what makes a cached prefix local to them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// That node's base URL, if the conductor does not know it yet (for snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_url: Option<String>,
}

/// `POST /v1/nodes`: a storage node's name and base URL (where its snapshot is fetched).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub node: String,
    pub url: String,
}

/// `POST /v1/instances/{id}/load`: what an instance measured about itself. Every field is
/// optional; what is missing is taken from the conductor's own bookkeeping. A report also
/// counts as a heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Prefill: prompt tokens waiting or being computed (uncached part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_prefill_tokens: Option<u64>,
    /// Prefill: the instance's own estimate of the time to drain its queue; preferred over
    /// `queued_prefill_tokens` when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_prefill_ms: Option<f64>,
    /// Decode: requests in the running batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<u32>,
    /// Decode: tokens of context held by the running batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_tokens: Option<u64>,
}

/// One row of `GET /v1/instances`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub id: String,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Heard from within the liveness timeout; only live instances are routed to.
    pub alive: bool,
    /// Predicted wait for new prefill work, now.
    pub queue_ms: f64,
    /// Predicted running decode requests and their context tokens, now.
    pub decode_requests: f64,
    pub decode_tokens: f64,
    /// Requests routed to this instance since it registered.
    pub routed: u64,
    /// Milliseconds since the last load report, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_age_ms: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> RouteRequest {
        RouteRequest {
            bucket: "llama".into(),
            ..Default::default()
        }
    }

    #[test]
    fn tokens_are_hashed_in_full_blocks() {
        let h = BlockHasher::new(4);
        let req = RouteRequest {
            token_ids: Some((0..10).collect()),
            ..base()
        };
        let r = req.resolve(&h).expect("valid");
        assert_eq!(r.input_tokens, 10);
        assert_eq!(r.blocks, h.hash_tokens(&(0..10).collect::<Vec<_>>()));
        let bad = RouteRequest {
            input_length: Some(11),
            ..req
        };
        assert!(matches!(
            bad.resolve(&h),
            Err(RouteRequestError::InputLengthMismatch { .. })
        ));
    }

    #[test]
    fn hashes_need_enough_input() {
        let h = BlockHasher::new(4);
        let blocks = vec![BlockHash::from_id(1), BlockHash::from_id(2)];
        let req = RouteRequest {
            block_hashes: Some(blocks.clone()),
            ..base()
        };
        assert_eq!(req.resolve(&h).map(|r| r.input_tokens), Ok(8));
        let longer = RouteRequest {
            input_length: Some(9),
            ..req.clone()
        };
        assert_eq!(longer.resolve(&h).map(|r| r.input_tokens), Ok(9));
        let shorter = RouteRequest {
            input_length: Some(7),
            ..req.clone()
        };
        assert!(matches!(
            shorter.resolve(&h),
            Err(RouteRequestError::InputShorterThanBlocks { .. })
        ));
        let both = RouteRequest {
            token_ids: Some(vec![1]),
            ..req
        };
        assert_eq!(both.resolve(&h), Err(RouteRequestError::BothPrefixForms));
    }

    #[test]
    fn engine_keys_resolve_to_their_ids() {
        let h = BlockHasher::new(16);
        let keys: Vec<String> = vec!["ab12_0_k".into(), "cd34_0_k".into()];
        let req = RouteRequest {
            block_keys: Some(keys.clone()),
            input_length: Some(40),
            ..base()
        };
        let r = req.resolve(&h).expect("valid");
        assert_eq!(
            r.blocks,
            vec![BlockHash::of_key(&keys[0]), BlockHash::of_key(&keys[1])]
        );
        assert_eq!(r.input_tokens, 40);
        // Without input_length the prompt is exactly those blocks.
        let exact = RouteRequest {
            input_length: None,
            ..req.clone()
        };
        assert_eq!(exact.resolve(&h).map(|r| r.input_tokens), Ok(32));
        // Yutu's own hex keys keep their hashes.
        let hex = BlockHash::from_id(3);
        let own = RouteRequest {
            block_keys: Some(vec![hex.to_key()]),
            ..base()
        };
        assert_eq!(own.resolve(&h).map(|r| r.blocks), Ok(vec![hex]));
        let both = RouteRequest {
            block_hashes: Some(vec![hex]),
            ..req.clone()
        };
        assert_eq!(both.resolve(&h), Err(RouteRequestError::BothPrefixForms));
        let bad = RouteRequest {
            block_keys: Some(vec!["ok".into(), String::new()]),
            ..base()
        };
        assert_eq!(
            bad.resolve(&h),
            Err(RouteRequestError::BlockKey {
                index: 1,
                source: KeyError::Empty
            })
        );
        // The wire form.
        let wire: RouteRequest =
            serde_json::from_str(r#"{"bucket": "llama", "block_keys": ["m@1@0@ff@bf16"]}"#)
                .expect("parses");
        assert_eq!(wire.block_keys, Some(vec!["m@1@0@ff@bf16".to_string()]));
    }

    #[test]
    fn bad_fields_are_refused() {
        let h = BlockHasher::new(4);
        assert_eq!(base().resolve(&h), Err(RouteRequestError::NoInput));
        let zero = RouteRequest {
            input_length: Some(0),
            ..base()
        };
        assert_eq!(zero.resolve(&h), Err(RouteRequestError::InputLength));
        let slo = RouteRequest {
            input_length: Some(5),
            slo: Some(Slo {
                ttft_ms: Some(f64::NAN),
                tbt_ms: None,
            }),
            ..base()
        };
        assert_eq!(slo.resolve(&h), Err(RouteRequestError::Slo("slo.ttft_ms")));
        let bucket = RouteRequest {
            bucket: "A".into(),
            input_length: Some(5),
            ..base()
        };
        assert!(matches!(
            bucket.resolve(&h),
            Err(RouteRequestError::Bucket(_))
        ));
    }

    #[test]
    fn slo_misses_are_429_and_no_capacity_503() {
        assert_eq!(RejectReason::TtftSlo.status(), 429);
        assert_eq!(RejectReason::TbtSlo.status(), 429);
        assert_eq!(RejectReason::NoDecodeInstance.status(), 503);
    }
}
