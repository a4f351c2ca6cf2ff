//! User-space block storage for the NVMe tier (filled by the NVMe-tier work).
