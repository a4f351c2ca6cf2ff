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
    keep_freed_memory();
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
        listen = %settings.listen, shards = settings.shards, memory = settings.memory,
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

/// Most freed bytes glibc keeps at the top of a heap before it gives them back.
const TRIM_THRESHOLD: libc::c_int = 16 << 20;
/// Allocations from this size on get their own mapping (glibc's ceiling for its own
/// adaptive threshold).
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// glibc gives the free memory at the top of a heap back to the kernel once more than
/// 128 KiB of it is free (until its adaptive threshold has seen a large block freed), and
/// the next allocation faults those pages in again. A small KV read allocates and frees a
/// few buffers of its value's size per call, so a 64 KiB read faulted about fifty pages on
/// every call: 87 us p50 against 56 with these limits, 4 KiB 25 against 20 (one client,
/// one key, 2 vCPUs). Blocks up to 32 MiB then come from the heaps, and each heap keeps up
/// to 16 MiB free. An operator's `GLIBC_TUNABLES` for malloc is left to decide.
fn keep_freed_memory() {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("malloc")) {
        return;
    }
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters, under its own locks; no pointer
    // is passed.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

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
