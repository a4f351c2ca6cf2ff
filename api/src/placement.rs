//! Which shard owns a key.
//!
//! The owner is a blake3 hash of the bucket and key modulo the shard count. A cryptographic
//! hash is stable across Rust versions and platforms (unlike `std`'s hasher) and spreads
//! adversarial key sets evenly, which matters once clients choose their own keys.

/// The shard (of `shards`) that owns `bucket/key`.
pub fn shard_for(bucket: &str, key: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut h = blake3::Hasher::new();
    h.update(&(bucket.len() as u64).to_le_bytes());
    h.update(bucket.as_bytes());
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    (u64::from_le_bytes(first) % shards as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_and_is_stable() {
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[shard_for("b", &format!("key-{i}"), 4)] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert_eq!(shard_for("b", "k", 1), 0);
        assert_eq!(shard_for("b", "k", 7), shard_for("b", "k", 7));
    }
}
