//! Conductor: KV-cache-aware routing (filled by the conductor work).
