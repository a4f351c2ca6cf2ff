//! The cost model: how long prefill, a decode step and a KV transfer take.
//!
//! Routing compares predicted times, so every decision is only as good as these formulas.
//! They are deliberately simple and configurable (see [`crate::poly`]); the defaults describe
//! a LLaMA3-70B-class model on one 8-GPU node, which is what Mooncake's numbers are about:
//!
//! - **prefill** (`n` prompt tokens, `c` of them cached):
//!   `10 + 0.08*n - 0.08*c + 1.5e-6*n^2 - 1.5e-6*c^2` ms. The linear part is the MLP and
//!   projections of the `n - c` new tokens (about 12.5k tokens/s); the quadratic part is
//!   attention, where each new token attends to everything before it: summing over positions
//!   `c..n` gives a term in `n^2 - c^2`. A 16k-token prompt takes about 1.7 s uncached.
//! - **decode step** (`b` requests in the batch, `t` context tokens in all):
//!   `20 + 0.1*b + 2e-5*t` ms. A step reads the weights once (the constant) and every
//!   request's KV (320 KiB per token at ~16 TB/s of HBM, 2e-5 ms per token).
//! - **KV transfer**: 320 KiB per token (LLaMA3-70B), 25 GB/s between nodes (200 Gb/s RDMA),
//!   6 GB/s from NVMe, plus 1 ms to set a transfer up. Blocks already in the prefill node's
//!   DRAM cost nothing: they are loaded layer by layer while the previous layer computes.
//!   A 512-token block moves between nodes in about 7 ms and takes about 40 ms to recompute,
//!   which is why pulling a longer prefix from another node usually wins.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use yutu_api::events::Tier;

use crate::poly::{PolyError, Polynomial};

/// The default prefill polynomial (see the module docs).
pub const DEFAULT_PREFILL: &str = "10 + 0.08*n - 0.08*c + 1.5e-6*n^2 - 1.5e-6*c^2";
/// The default decode-step polynomial (see the module docs).
pub const DEFAULT_DECODE_STEP: &str = "20 + 0.1*b + 2e-5*t";

/// Prefill-time and decode-time models and transfer bandwidths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostModel {
    /// Prefill milliseconds as a polynomial in `n` (prompt tokens) and `c` (cached tokens).
    #[serde(serialize_with = "ser_poly", deserialize_with = "de_prefill")]
    pub prefill: Polynomial,
    /// Milliseconds of one decode step as a polynomial in `b` (batch size) and `t` (context
    /// tokens of the whole batch).
    #[serde(serialize_with = "ser_poly", deserialize_with = "de_decode")]
    pub decode_step: Polynomial,
    /// KV-cache bytes per token (LLaMA3-70B: 320 KiB).
    pub kv_bytes_per_token: f64,
    /// Node-to-node transfer bandwidth, GB/s (10^9 bytes).
    pub network_gb_per_s: f64,
    /// NVMe read bandwidth of a node, GB/s.
    pub nvme_gb_per_s: f64,
    /// Fixed cost of starting a transfer, ms.
    pub transfer_setup_ms: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill: prefill_poly(DEFAULT_PREFILL).expect("the default prefill model parses"),
            decode_step: decode_poly(DEFAULT_DECODE_STEP).expect("the default decode model parses"),
            kv_bytes_per_token: 320.0 * 1024.0,
            network_gb_per_s: 25.0,
            nvme_gb_per_s: 6.0,
            transfer_setup_ms: 1.0,
        }
    }
}

/// Parses a prefill polynomial over `n` and `c`.
pub fn prefill_poly(text: &str) -> Result<Polynomial, PolyError> {
    Polynomial::parse(text, ['n', 'c'])
}

/// Parses a decode-step polynomial over `b` and `t`.
pub fn decode_poly(text: &str) -> Result<Polynomial, PolyError> {
    Polynomial::parse(text, ['b', 't'])
}

fn ser_poly<S: Serializer>(p: &Polynomial, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.text())
}

fn de_prefill<'de, D: Deserializer<'de>>(d: D) -> Result<Polynomial, D::Error> {
    let text = String::deserialize(d)?;
    prefill_poly(&text).map_err(serde::de::Error::custom)
}

fn de_decode<'de, D: Deserializer<'de>>(d: D) -> Result<Polynomial, D::Error> {
    let text = String::deserialize(d)?;
    decode_poly(&text).map_err(serde::de::Error::custom)
}

impl CostModel {
    /// Milliseconds to prefill `input` tokens of which the first `cached` are already in the
    /// KV cache. Never negative, and at least the cost of one token: even a fully cached
    /// prompt computes its last token to produce the first output token.
    pub fn prefill_ms(&self, input: u64, cached: u64) -> f64 {
        let n = input as f64;
        let c = cached.min(input.saturating_sub(1)) as f64;
        self.prefill.eval(n, c).max(0.0)
    }

    /// Milliseconds of one decode step for `batch` requests holding `tokens` of context.
    pub fn decode_step_ms(&self, batch: f64, tokens: f64) -> f64 {
        self.decode_step
            .eval(batch.max(0.0), tokens.max(0.0))
            .max(0.0)
    }

    /// Milliseconds to bring `tokens` worth of KV into the prefill node's memory from `tier`,
    /// on the same node (`remote = false`) or from another node.
    pub fn transfer_ms(&self, tokens: u64, tier: Tier, remote: bool) -> f64 {
        if tokens == 0 || (!remote && tier == Tier::Dram) {
            return 0.0;
        }
        let net = self.network_gb_per_s.max(1e-9);
        let nvme = self.nvme_gb_per_s.max(1e-9);
        let gb_per_s = match (remote, tier) {
            (true, Tier::Dram) => net,
            (true, Tier::Nvme) => net.min(nvme),
            (false, _) => nvme,
        };
        let bytes = tokens as f64 * self.kv_bytes_per_token;
        // GB/s is 10^6 bytes per millisecond.
        self.transfer_setup_ms + bytes / (gb_per_s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caching_reduces_prefill_time_and_never_below_zero() {
        let m = CostModel::default();
        let full = m.prefill_ms(16_384, 0);
        assert!((1_500.0..2_000.0).contains(&full), "{full}");
        let half = m.prefill_ms(16_384, 8_192);
        assert!(half < full && half > 0.0);
        // The second half of a prompt costs more than the first (attention grows).
        assert!(full - half < half);
        // Fully cached still computes one token; more cached than input is clamped.
        let all = m.prefill_ms(16_384, 16_384);
        assert!(all > 0.0 && all < 20.0, "{all}");
        assert_eq!(m.prefill_ms(16_384, 1 << 40), all);
    }

    #[test]
    fn pulling_a_block_beats_recomputing_it() {
        let m = CostModel::default();
        let pull = m.transfer_ms(512, Tier::Dram, true);
        let recompute = m.prefill_ms(512, 0);
        assert!(pull < recompute / 3.0, "pull {pull} recompute {recompute}");
        assert_eq!(m.transfer_ms(512, Tier::Dram, false), 0.0);
        assert!(m.transfer_ms(512, Tier::Nvme, false) > pull);
        assert!(m.transfer_ms(512, Tier::Nvme, true) >= m.transfer_ms(512, Tier::Nvme, false));
        assert_eq!(m.transfer_ms(0, Tier::Nvme, true), 0.0);
    }

    #[test]
    fn decode_step_grows_with_batch_and_context() {
        let m = CostModel::default();
        assert_eq!(m.decode_step_ms(0.0, 0.0), 20.0);
        assert!(m.decode_step_ms(64.0, 1e6) > m.decode_step_ms(1.0, 1e4));
    }

    #[test]
    fn config_text_round_trips() {
        let m: CostModel = toml::from_str(
            "prefill = \"1 + 0.5*n - 0.5*c\"\ndecode_step = \"5 + t\"\nnetwork_gb_per_s = 50",
        )
        .expect("parses");
        assert_eq!(m.prefill_ms(10, 4), 4.0);
        assert_eq!(m.decode_step_ms(3.0, 2.0), 7.0);
        assert_eq!(m.network_gb_per_s, 50.0);
        assert_eq!(m.nvme_gb_per_s, 6.0);
        assert!(toml::from_str::<CostModel>("prefill = \"3*q\"").is_err());
        assert!(toml::from_str::<CostModel>("typo = 1").is_err());
        let text = toml::to_string(&m).expect("serializes");
        assert_eq!(toml::from_str::<CostModel>(&text).expect("round trip"), m);
    }
}
