//! `yutu-server`: starts a storage node.

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use yutu_api::token::{FIRST_TOKEN_FILE, LOCAL_KID};
use yutu_server::auth::local_key;
use yutu_server::config::{Flags, LogFormat, Settings};

fn main() -> anyhow::Result<()> {
    let mut settings = Settings::resolve(Flags::parse())?;
    init_logging(settings.log_format);
    raise_memlock_limit();
    if settings.prefault {
        check_prefault_fits(settings.memory)?;
    }
    // Stored bytes are the tenants': the data directory and everything the node writes are
    // its own user's only, whatever the umask.
    let nvme_outside: Vec<&std::path::Path> = settings
        .nvme
        .as_deref()
        .filter(|p| !p.starts_with(&settings.data_dir))
        .into_iter()
        .collect();
    yutu_server::node::data_dir::secure(&settings.data_dir, &nvme_outside).with_context(|| {
        format!(
            "cannot create data directory {} private to this user",
            settings.data_dir.display()
        )
    })?;
    // Secure by default: the node's own token key, and an admin token at the first start.
    let first_token = if settings.no_auth {
        tracing::warn!(
            "--no-auth: every client may read, write and delete everything on this node \
             (for experiments only; without the flag the node serves authenticated)"
        );
        None
    } else {
        let local =
            local_key::ensure(&settings.data_dir).context("cannot set up the node's token key")?;
        settings
            .keyring
            .add_secret(LOCAL_KID, &local.secret)
            .context("a [[token_keys]] entry uses the node's own kid \"local\"")?;
        local.first_token
    };
    if let Some(path) = &settings.nvme {
        yutu_server::tier::nvme::prepare_file(path, settings.nvme_capacity).map_err(|e| {
            anyhow::anyhow!(
                "cannot prepare the NVMe tier file {} ({} bytes): {e}",
                path.display(),
                settings.nvme_capacity
            )
        })?;
    }
    tracing::info!(
        listen = %settings.listen, shards = settings.shards, pinned = settings.pin_shards,
        copy_threads = settings.copy_threads,
        memory = settings.memory,
        max_object_size = settings.max_object_size, data_dir = %settings.data_dir.display(),
        "starting yutu-server {}", env!("CARGO_PKG_VERSION")
    );
    let stop = yutu_server::node::shutdown::StopFlag::default();
    stop.on_signals()
        .context("cannot install the SIGTERM handler")?;
    let settings_data_dir = settings.data_dir.clone();
    let node = yutu_server::serve::start(settings, stop).context("cannot start the node")?;
    tracing::info!(addr = %node.addr, "listening on {}", node.addr);
    if let Some(token) = first_token {
        let saved = settings_data_dir.join(FIRST_TOKEN_FILE);
        eprintln!(
            "\nAuthentication is on. This node's first admin token (valid 30 days, also saved \
             in {}):\n\n    {token}\n\nSend it as `Authorization: Bearer <token>`; issue \
             scoped tokens with `yutu token issue --data-dir {} --sub NAME --bucket NAME:rwdl`.\n",
            saved.display(),
            settings_data_dir.display()
        );
    }
    node.join();
    tracing::info!("stopped");
    Ok(())
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("YUTU_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `--prefault` takes all of `--memory` at once: refused up front when the machine does not
/// have that much available, rather than the kernel's OOM killer stopping the node later.
fn check_prefault_fits(memory: u64) -> anyhow::Result<()> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let available = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024);
    match available {
        Some(a) if memory > a => anyhow::bail!(
            "--prefault with --memory {memory} bytes, but only {a} bytes are available on \
             this machine (MemAvailable); lower --memory or leave out --prefault"
        ),
        _ => Ok(()),
    }
}

/// The node's allocator. A shard allocates and frees a request's buffers, keys and index
/// entries on its own thread, which mimalloc's thread-local heaps serve without locks; with
/// glibc's malloc, about a fifth of a shard's CPU in the Rust kv suite's 4 KiB batches went
/// to `malloc`, `free` and `malloc_consolidate`, and that case moved 10-17% fewer blocks a
/// second (`yutu-bench kv --small-only`, the two builds alternated three times each).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `arena_eager_commit` option: its place in mimalloc 2's `mi_option_e` (the -sys
/// crate is pinned; `memory_bound::writing_3x_capacity_evicts_and_stays_bounded` fails when
/// the option stops taking effect).
const MI_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// On a system that overcommits, mimalloc commits its arenas eagerly by default and then
/// gives freed pages of them back late: a node taking 1 MiB writes from four clients peaked
/// at 150 MiB resident for 64 MiB of DRAM (109 with glibc's malloc), 111 with eager commit
/// off. Freed memory still goes back only after mimalloc's purge delay (10 ms), so a client
/// calling more often than that reuses its buffers' pages rather than faulting them in
/// again. A `MIMALLOC_ARENA_EAGER_COMMIT` in the node's environment takes precedence.
///
/// The option is read when mimalloc reserves its first arena, at the process's first
/// allocation, which Rust's runtime makes before `main`: so this runs as an ELF constructor,
/// before the runtime starts (and before any thread exists).
extern "C" fn tune_allocator() {
    // SAFETY: `getenv` with a NUL-terminated name, before any thread exists (nothing can
    // change the environment meanwhile); it allocates nothing, so mimalloc is not started
    // before its option is set. `mi_option_set` takes an integer, no pointer.
    unsafe {
        if libc::getenv(c"MIMALLOC_ARENA_EAGER_COMMIT".as_ptr()).is_null() {
            libmimalloc_sys::mi_option_set(MI_ARENA_EAGER_COMMIT, 0);
        }
    }
}

// SAFETY: the dynamic loader calls every `.init_array` entry once, on the main thread, before
// Rust's runtime starts; `tune_allocator` relies on nothing the runtime sets up (no allocation,
// no std I/O, no panics on its path). `#[used]` keeps the entry when nothing refers to it.
#[used]
#[link_section = ".init_array"]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

/// io_uring (under glommio) locks memory for its rings and buffers. A distribution default
/// of 8 MiB is too little for several shards, so raise the soft limit to the hard one.
fn raise_memlock_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                tracing::warn!("cannot raise RLIMIT_MEMLOCK; io_uring set-up may fail");
            }
        }
    }
}
