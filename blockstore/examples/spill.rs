//! Measures the region store's spill bandwidth on a file, without the bench harness:
//!
//! ```text
//! cargo run --release -p yutu-blockstore --example spill -- DIR [RECORD_BYTES] [TOTAL_MIB] [CHUNK_KIB] [INFLIGHT] [READERS] [IO_MEMORY_MIB]
//! ```

use yutu_blockstore::measure::{run_spill, SpillConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i)
            .map(|s| s.parse().expect("a number"))
            .unwrap_or(default)
    };
    let dir = std::path::PathBuf::from(args.first().map_or("/var/tmp", String::as_str));
    let record = arg(1, 1 << 20) as usize;
    let total = arg(2, 1024) << 20;
    let chunk = (arg(3, 1024) << 10) as usize;
    let inflight = arg(4, 8) as usize;
    let readers = arg(5, 8) as usize;
    let region_size = 64 << 20;
    let path = dir.join(format!("yutu-spill-{}.img", std::process::id()));
    let mut cfg = SpillConfig {
        path: path.clone(),
        file_size: total + 4 * region_size,
        record_size: record,
        total_bytes: total,
        region_size,
        write_chunk: chunk,
        max_inflight_writes: inflight,
        read_concurrency: readers,
        io_memory: 0,
    };
    cfg.io_memory = match args.get(6) {
        Some(mib) => mib.parse::<usize>().expect("a number") << 20,
        None => cfg.suggested_io_memory(),
    };
    let res = run_spill(&cfg);
    let _ = std::fs::remove_file(&path);
    let res = res.expect("measurement");
    println!(
        "record {record} chunk {chunk} inflight {inflight} readers {readers} io_memory {} MiB: \
         write {:.0} MB/s, read {:.0} MB/s, reopen {:?} ({} records)",
        cfg.io_memory >> 20,
        res.write_mb_per_s(),
        res.read_mb_per_s(),
        res.reopen_time,
        res.records
    );
}
