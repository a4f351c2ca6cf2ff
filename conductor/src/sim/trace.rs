//! Mooncake's trace format: one JSON object per line.
//!
//! ```json
//! {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2]}
//! ```
//!
//! `timestamp` is the arrival in ms; `hash_ids` has one id per block of the prompt (512
//! tokens in Mooncake's traces, the last one possibly partial), each naming the block *and
//! everything before it*, so two requests share a prefix exactly as far as their lists
//! agree. Ids are remapped to dense integers (for the simulated caches) and to block hashes
//! (for the conductor's index, which is keyed by real hashes).

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use yutu_api::block_hash::BlockHash;

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {source}")]
    Json {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path} line {line}: timestamps must not go backwards")]
    Unordered { path: String, line: usize },
    #[error("{path} has no requests")]
    Empty { path: String },
}

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// One request of the trace.
#[derive(Debug, Clone)]
pub struct TraceRequest {
    pub arrival_ms: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Its blocks, as a range into [`Trace::ids`] and [`Trace::hashes`].
    pub blocks: Range<usize>,
}

/// A whole trace, with its blocks laid out contiguously.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: String,
    pub requests: Vec<TraceRequest>,
    /// Dense block ids (0..distinct), request after request.
    pub ids: Vec<u32>,
    /// The same blocks as hashes.
    pub hashes: Vec<BlockHash>,
    /// The hash of each dense id.
    pub by_id: Vec<BlockHash>,
    /// Distinct blocks.
    pub distinct: usize,
}

impl Trace {
    /// Reads a trace file (at most `limit` requests when given).
    pub fn load(path: &Path, limit: Option<usize>) -> Result<Trace, TraceError> {
        let p = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: p.clone(),
            source,
        })?;
        let name = path
            .file_name()
            .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned());
        let mut lines = Vec::new();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            if limit.is_some_and(|l| lines.len() >= l) {
                break;
            }
            let line = line.map_err(|source| TraceError::Io {
                path: p.clone(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(&line).map_err(|source| TraceError::Json {
                path: p.clone(),
                line: i + 1,
                source,
            })?;
            lines.push((i + 1, parsed));
        }
        Self::from_lines(name, &p, lines)
    }

    fn from_lines(
        name: String,
        path: &str,
        lines: Vec<(usize, Line)>,
    ) -> Result<Trace, TraceError> {
        if lines.is_empty() {
            return Err(TraceError::Empty { path: path.into() });
        }
        let mut dense: HashMap<u64, u32> = HashMap::new();
        let mut hash_of: Vec<BlockHash> = Vec::new();
        let mut t = Trace {
            name,
            requests: Vec::with_capacity(lines.len()),
            ids: Vec::new(),
            hashes: Vec::new(),
            by_id: Vec::new(),
            distinct: 0,
        };
        let mut last = f64::NEG_INFINITY;
        for (line, l) in lines {
            if l.timestamp < last || !l.timestamp.is_finite() {
                return Err(TraceError::Unordered {
                    path: path.into(),
                    line,
                });
            }
            last = l.timestamp;
            let start = t.ids.len();
            for raw in &l.hash_ids {
                let id = *dense.entry(*raw).or_insert_with(|| {
                    hash_of.push(BlockHash::from_id(*raw));
                    (hash_of.len() - 1) as u32
                });
                t.ids.push(id);
                t.hashes.push(hash_of[id as usize]);
            }
            t.requests.push(TraceRequest {
                arrival_ms: l.timestamp,
                input_tokens: l.input_length.max(1),
                output_tokens: l.output_length,
                blocks: start..t.ids.len(),
            });
        }
        t.distinct = hash_of.len();
        t.by_id = hash_of;
        Ok(t)
    }

    /// The hit ratio of an infinite cache shared by everyone (block-weighted): a block is a
    /// hit when any earlier request had it. No placement policy can beat it.
    pub fn upper_bound_hit_ratio(&self) -> f64 {
        let mut seen = HashSet::with_capacity(self.distinct);
        let hits = self.ids.iter().filter(|id| !seen.insert(**id)).count();
        hits as f64 / self.ids.len().max(1) as f64
    }

    /// The block ids of a request.
    pub fn ids_of(&self, r: &TraceRequest) -> &[u32] {
        &self.ids[r.blocks.clone()]
    }

    /// The block hashes of a request.
    pub fn hashes_of(&self, r: &TraceRequest) -> &[BlockHash] {
        &self.hashes[r.blocks.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        let lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, serde_json::from_str::<Line>(l).expect("test json")))
            .collect();
        Trace::from_lines("t".into(), "t", lines)
    }

    #[test]
    fn ids_are_dense_and_the_upper_bound_counts_repeats() {
        let t = parse(
            "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [7, 8]}\n\
             {\"timestamp\": 5, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [7, 8, 9]}\n\
             {\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [100]}",
        )
        .expect("parses");
        assert_eq!(t.distinct, 4);
        assert_eq!(t.ids, vec![0, 1, 0, 1, 2, 3]);
        assert_eq!(t.hashes_of(&t.requests[1])[0], BlockHash::from_id(7));
        assert!((t.upper_bound_hit_ratio() - 2.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn time_must_not_go_backwards() {
        let r = parse(
            "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n\
             {\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
        );
        assert!(matches!(r, Err(TraceError::Unordered { line: 2, .. })));
    }
}
