//! Chained block hashes: the names of KV-cache blocks.
//!
//! An inference engine splits a prompt into blocks of `block_tokens` tokens. Block `i` is named
//! by a hash of *all* tokens up to and including it, computed as a chain:
//!
//! ```text
//! hash_0 = blake3(ROOT    || le_bytes(tokens[0 .. B]))
//! hash_i = blake3(hash_i-1 || le_bytes(tokens[i*B .. (i+1)*B]))      ROOT = 32 zero bytes
//! ```
//!
//! so one hash names a whole prefix: two prompts share block `i` exactly when they share their
//! first `(i+1)*B` tokens. Only full blocks are hashed; the tail of a prompt shorter than a
//! block is always recomputed (the engine cannot share a half-filled block). Token ids are
//! `u32` and enter the hash as 4 little-endian bytes each, so the same tokens give the same
//! hash on every platform.
//!
//! A block is stored in a storage node as an object whose key is the lowercase hex of its hash
//! (64 characters), in a bucket per model. [`BlockHash::from_key`] is the test a node uses to
//! decide whether an object stored through S3 is a KV block at all (and therefore produces KV
//! events).
//!
//! Inference engines that store blocks through the KV API name them themselves (SGLang
//! `"{hash}_{tp_rank}_k"`, LMCache `"{model}@{world}@{worker}@{chunk_hash}@{dtype}"`, ...).
//! Such a key is indexed under its opaque id [`BlockHash::of_key`]: the key itself when it
//! already is a block hash, otherwise a domain-separated blake3 of its bytes. Node and
//! conductor compute the same id, so a router can name a prompt's prefix by the engine's own
//! keys, in chain order. (Engines' keys already name a whole prefix — their hashes chain over
//! the blocks before them — so the order of the keys in a request is all the chain needs.)

use std::fmt;
use std::str::FromStr;

/// The domain-separation prefix of [`BlockHash::of_key`]: an engine key's id is
/// `blake3(ENGINE_KEY_DOMAIN || key bytes)`.
pub const ENGINE_KEY_DOMAIN: &[u8] = b"yutu/engine-key/v1\0";

/// The 32-byte blake3 name of one KV block (and of the whole prefix it ends).
///
/// On the wire (JSON) and as an object key it is 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockHash(pub [u8; 32]);

/// Why a string is not a block hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockHashError {
    #[error("a block hash is 64 hex characters, got {0}")]
    Length(usize),
    #[error("a block hash is lowercase hex; found {0:?}")]
    NotHex(char),
}

impl BlockHash {
    /// The parent of the first block of every chain.
    pub const ROOT: BlockHash = BlockHash([0; 32]);

    /// The hash of the block that follows `parent` and holds `tokens`.
    pub fn chain(parent: &BlockHash, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(&parent.0);
        // Hash in slabs so long blocks need no allocation and few update calls.
        let mut buf = [0u8; 256];
        for chunk in tokens.chunks(buf.len() / 4) {
            for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 4]);
        }
        BlockHash(*h.finalize().as_bytes())
    }

    /// Parses an object key as a block hash: exactly 64 lowercase hex characters. Keys of any
    /// other shape are ordinary objects, not KV blocks.
    pub fn from_key(key: &str) -> Option<BlockHash> {
        key.parse().ok()
    }

    /// The opaque id of a block stored under an engine-chosen `key` (any valid object key): the
    /// key's own hash when it is one ([`BlockHash::from_key`]), so that Yutu's own block keys
    /// keep their names, otherwise `blake3(ENGINE_KEY_DOMAIN || key)`. The domain prefix keeps
    /// these ids apart from chained token hashes and from [`BlockHash::from_id`]. Keys are at
    /// most [`crate::key::MAX_KEY_LEN`] bytes, so hashing one is cheap.
    pub fn of_key(key: &str) -> BlockHash {
        if let Some(h) = BlockHash::from_key(key) {
            return h;
        }
        let mut h = blake3::Hasher::new();
        h.update(ENGINE_KEY_DOMAIN);
        h.update(key.as_bytes());
        BlockHash(*h.finalize().as_bytes())
    }

    /// The object key a storage node stores this block under (lowercase hex).
    pub fn to_key(&self) -> String {
        self.to_string()
    }

    /// A hash derived from an opaque integer id, for traces that number their blocks
    /// (Mooncake's `hash_ids`) instead of carrying real hashes. Distinct ids give distinct,
    /// uniformly spread hashes, which the conductor's index relies on.
    pub fn from_id(id: u64) -> BlockHash {
        BlockHash(*blake3::hash(&id.to_le_bytes()).as_bytes())
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[(b >> 4) as usize];
            out[2 * i + 1] = DIGITS[(b & 0xf) as usize];
        }
        // Every byte written above is an ASCII hex digit.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({self})")
    }
}

impl FromStr for BlockHash {
    type Err = BlockHashError;

    /// Strict: lowercase only, so that a key and a hash map one to one (`ABCD…` and `abcd…`
    /// would be two different objects in a bucket but the same hash).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(BlockHashError::Length(s.chars().count()));
        }
        let nibble = |b: u8| -> Result<u8, BlockHashError> {
            match b {
                b'0'..=b'9' => Ok(b - b'0'),
                b'a'..=b'f' => Ok(b - b'a' + 10),
                _ => Err(BlockHashError::NotHex(b as char)),
            }
        };
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Ok(BlockHash(out))
    }
}

impl serde::Serialize for BlockHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for BlockHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = BlockHash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a block hash as 64 lowercase hex characters")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<BlockHash, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// Turns token ids into the chain of hashes of their full blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    /// Tokens per block; Mooncake uses 512, vLLM's paged attention 16. Must match the engine
    /// that stores the blocks, or no prefix will ever match.
    pub block_tokens: usize,
}

impl BlockHasher {
    /// A hasher for blocks of `block_tokens` tokens (at least 1).
    pub fn new(block_tokens: usize) -> BlockHasher {
        BlockHasher {
            block_tokens: block_tokens.max(1),
        }
    }

    /// Hashes of every full block of `tokens`, in order; a partial tail block is left out.
    pub fn hash_tokens(&self, tokens: &[u32]) -> Vec<BlockHash> {
        self.hash_tokens_from(&BlockHash::ROOT, tokens)
    }

    /// Continues a chain after `parent` (the hash of the last block already hashed), so that an
    /// engine can extend a prompt's hashes as decoding fills more blocks.
    pub fn hash_tokens_from(&self, parent: &BlockHash, tokens: &[u32]) -> Vec<BlockHash> {
        let bt = self.block_tokens.max(1);
        let mut out = Vec::with_capacity(tokens.len() / bt);
        let mut prev = *parent;
        for block in tokens.chunks_exact(bt) {
            prev = BlockHash::chain(&prev, block);
            out.push(prev);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_blake3_of_parent_and_le_tokens() {
        let tokens = [1u32, 2, 0x0102_0304];
        let mut bytes = vec![0u8; 32];
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(
            BlockHash::chain(&BlockHash::ROOT, &tokens).0,
            *blake3::hash(&bytes).as_bytes()
        );
    }

    #[test]
    fn long_blocks_hash_like_one_update() {
        let tokens: Vec<u32> = (0..1000).collect();
        let mut bytes = vec![7u8; 32];
        for t in &tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(
            BlockHash::chain(&BlockHash([7; 32]), &tokens).0,
            *blake3::hash(&bytes).as_bytes()
        );
    }

    #[test]
    fn only_full_blocks_and_shared_prefixes_share_hashes() {
        let h = BlockHasher::new(4);
        let a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        b[6] = 99; // second block differs
        let ha = h.hash_tokens(&a);
        let hb = h.hash_tokens(&b);
        assert_eq!(ha.len(), 2, "10 tokens make 2 full blocks of 4");
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // A chain continued from a parent equals hashing the whole prompt.
        assert_eq!(h.hash_tokens_from(&ha[0], &a[4..]), ha[1..].to_vec());
        // A later block's hash depends on everything before it.
        let mut c = a.clone();
        c[0] = 42;
        assert_ne!(h.hash_tokens(&c)[1], ha[1]);
    }

    #[test]
    fn hex_round_trip_is_strict_lowercase() {
        let h = BlockHash::chain(&BlockHash::ROOT, &[5, 6]);
        let key = h.to_key();
        assert_eq!(key.len(), 64);
        assert_eq!(key, key.to_lowercase());
        assert_eq!(BlockHash::from_key(&key), Some(h));
        assert_eq!(BlockHash::from_key(&key.to_uppercase()), None);
        assert_eq!(BlockHash::from_key("readme.md"), None);
        assert_eq!(BlockHash::from_key(&key[..63]), None);
        assert_eq!(
            "zz".repeat(32).parse::<BlockHash>(),
            Err(BlockHashError::NotHex('z'))
        );
        // Multi-byte characters are refused without panicking on a char boundary.
        assert!(BlockHash::from_key(&"é".repeat(32)).is_none());
    }

    #[test]
    fn engine_keys_map_to_domain_separated_ids() {
        // A key that already is a block hash is its own id: Yutu's blocks keep their names.
        let h = BlockHash::chain(&BlockHash::ROOT, &[1, 2, 3]);
        assert_eq!(BlockHash::of_key(&h.to_key()), h);
        // Engine keys: stable, distinct, and blake3 over the domain prefix and the key.
        let sglang = "a1b2c3_0_k";
        assert_eq!(BlockHash::of_key(sglang), BlockHash::of_key(sglang));
        let keys = [
            sglang,
            "a1b2c3_1_k",
            "a1b2c3_0_v",
            "a1b2c3__k",
            "llama@1@0@a1b2c3@bfloat16",
            "llama@1@0@a1b2c4@bfloat16",
            // Uppercase hex is not a block hash, so it is an engine key of its own.
            &h.to_key().to_uppercase(),
        ];
        let ids: std::collections::HashSet<BlockHash> =
            keys.iter().map(|k| BlockHash::of_key(k)).collect();
        assert_eq!(ids.len(), keys.len());
        let mut bytes = ENGINE_KEY_DOMAIN.to_vec();
        bytes.extend_from_slice(sglang.as_bytes());
        assert_eq!(
            BlockHash::of_key(sglang).0,
            *blake3::hash(&bytes).as_bytes()
        );
        // Domain separated: not the plain blake3 of the key, nor an id or a token hash.
        assert_ne!(
            BlockHash::of_key(sglang).0,
            *blake3::hash(sglang.as_bytes()).as_bytes()
        );
        let id_key = String::from_utf8(7u64.to_le_bytes().to_vec()).unwrap();
        assert_ne!(BlockHash::of_key(&id_key), BlockHash::from_id(7));
    }

    #[test]
    fn ids_map_to_distinct_hashes() {
        assert_ne!(BlockHash::from_id(1), BlockHash::from_id(2));
        assert_eq!(BlockHash::from_id(7), BlockHash::from_id(7));
    }
}
