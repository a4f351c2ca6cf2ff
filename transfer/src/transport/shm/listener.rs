//! The shm listener: a Unix socket that checks descriptors for same-host peers and hands them
//! the memfds of the segments they are allowed to map.
//!
//! A memfd is sent only in answer to a descriptor whose token verifies, and only for a
//! segment whose memfd is sealed against shrinking (see [`crate::MemoryRegion::sealed`]). The
//! socket is created under a temporary name, given its mode, and renamed into place, so it is
//! never reachable with looser permissions; it is removed when the listener stops.
//!
//! A segment of process memory (`MemoryRegion::process_memory`) has no memfd: with a checked
//! descriptor of one, the listener sends this process's memory file (`/proc/self/mem`,
//! opened once at start) instead, and the segment's address. See `mapping.rs` for what that
//! grants and why it is safe to hand over.
//!
//! The same connection also answers proof challenges (see `proof.rs`), so a node can check
//! that a socket a client names is that client's engine before it sends it anything else.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::fdpass::send_with_fds;
use super::wire::{self, Header, Verdict, CHECK_ENTRY_LEN, HEADER_LEN, PROVE_BODY_LEN};
use crate::descriptor::{Access, NodeId};
use crate::error::{Refusal, TransferError};
use crate::proof::Prover;
use crate::segment::SegmentTable;
use crate::stats::ListenerCounters;
use crate::transport::serve::Server;

/// A running shm listener; stops and removes its socket when dropped.
pub(crate) struct ShmListener {
    pub(crate) path: PathBuf,
    server: Option<Server>,
}

pub(crate) struct ShmListenOptions {
    pub(crate) node: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) mode: u32,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    /// Answers proof challenges.
    pub(crate) prover: Prover,
}

impl ShmListener {
    pub(crate) fn start(
        dir: &Path,
        segments: Arc<SegmentTable>,
        opts: ShmListenOptions,
        counters: Arc<ListenerCounters>,
    ) -> Result<ShmListener, TransferError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            TransferError::setup(
                format!("create the shm socket directory {}", dir.display()),
                e,
            )
        })?;
        let name = format!("yutu-{}-{:016x}.sock", opts.node, opts.incarnation);
        let path = dir.join(&name);
        let tmp = dir.join(format!("{name}.tmp"));
        let setup =
            |what: &str, e: io::Error| TransferError::setup(format!("{what} {}", tmp.display()), e);
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(|e| setup("bind the shm socket", e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(opts.mode))
            .map_err(|e| setup("set the mode of", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| setup("move into place", e))?;
        let hello = wire::encode_hello(opts.node, opts.incarnation);
        let memory = Arc::new(open_own_memory());
        let wake_path = path.clone();
        let idle = opts.idle_timeout;
        let prover = opts.prover;
        let serve_counters = Arc::clone(&counters);
        let listening = listener
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| TransferError::setup("duplicate the listening socket", e))?;
        let server = Server::spawn(
            "yutu-shm-listen",
            listening,
            move || listener.accept().map(|(s, _)| s),
            move |stream: UnixStream| {
                let own = Own {
                    prover: &prover,
                    hello: &hello,
                    memory: memory.as_ref().as_ref(),
                };
                if let Err(err) = serve(stream, &segments, &own, idle, &serve_counters) {
                    tracing::debug!(%err, "shm control connection ended");
                }
            },
            move || {
                let _ = UnixStream::connect(&wake_path);
            },
            opts.max_connections,
            counters,
        )
        .map_err(|e| TransferError::setup("start the shm listener thread", e))?;
        Ok(ShmListener {
            path,
            server: Some(server),
        })
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        // Stop accepting before the name disappears, so the wake-up connect still finds it.
        drop(self.server.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

/// This process's memory file, handed to peers for its process-memory segments; `None` (and
/// those segments answered `NotShareable`) when procfs is not mounted.
fn open_own_memory() -> Option<OwnedFd> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
    {
        Ok(f) => Some(f.into()),
        Err(err) => {
            tracing::warn!(%err, "cannot open /proc/self/mem: process memory is not offered over shm");
            None
        }
    }
}

/// What a connection answers with about this engine itself.
struct Own<'a> {
    prover: &'a Prover,
    hello: &'a [u8; wire::HELLO_LEN],
    memory: Option<&'a OwnedFd>,
}

fn serve(
    mut stream: UnixStream,
    segments: &SegmentTable,
    own: &Own<'_>,
    idle: Duration,
    counters: &ListenerCounters,
) -> io::Result<()> {
    let prover = own.prover;
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    stream.write_all(own.hello)?;
    loop {
        let mut header = [0u8; HEADER_LEN];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let count = match wire::decode_header(&header)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?
        {
            Header::Check(count) => count,
            Header::Prove => {
                let mut body = [0u8; PROVE_BODY_LEN];
                stream.read_exact(&mut body)?;
                let (challenger, nonce) = wire::decode_prove_body(&body);
                let answer = prover.answer(challenger, &nonce);
                if answer.is_err() {
                    tracing::debug!(%challenger, "proof challenge refused");
                }
                send_with_fds(stream.as_fd(), &wire::encode_answer(&answer), &[])?;
                continue;
            }
        };
        let mut body = vec![0u8; count * CHECK_ENTRY_LEN];
        stream.read_exact(&mut body)?;
        let mut verdicts = Vec::with_capacity(count);
        // Entries keep the segment (and so its memfd) alive until the message is sent.
        let mut attached = Vec::new();
        for raw in body.chunks_exact(CHECK_ENTRY_LEN) {
            ListenerCounters::add(&counters.requests, 1);
            let verdict = match wire::decode_check_entry(raw) {
                Err(refusal) => Err(refusal),
                // A mapping gives the peer read and write access to the whole segment: only
                // for shareable (unguarded) segments and read-write descriptors. Not shareable
                // comes first, so that the peer falls back to another path.
                Ok(entry) => match segments.check_descriptor(&entry.desc, entry.desc.access) {
                    Err(refusal) => Err(refusal),
                    Ok(seg) if !seg.shareable => Err(Refusal::NotShareable),
                    Ok(seg) if seg.region.process() && own.memory.is_none() => {
                        Err(Refusal::NotShareable)
                    }
                    Ok(_) if entry.desc.access != Access::ReadWrite => Err(Refusal::WrongAccess),
                    Ok(seg) => {
                        let len = seg.region.len() as u64;
                        let stable = seg.guard.is_none();
                        let process = seg.region.process().then(|| seg.region.as_ptr() as u64);
                        if entry.attach {
                            attached.push(seg);
                        }
                        Ok((len, stable, process))
                    }
                },
            };
            verdicts.push(match verdict {
                Ok((segment_len, stable, process)) => Verdict {
                    status: Ok(()),
                    segment_len,
                    stable,
                    process,
                },
                Err(refusal) => {
                    ListenerCounters::add(&counters.refused, 1);
                    Verdict {
                        status: Err(refusal),
                        segment_len: 0,
                        stable: false,
                        process: None,
                    }
                }
            });
        }
        // Only shareable segments are attached: memfds, or process memory (whose fd is the
        // memory file, present or refused above).
        let fds: Vec<BorrowedFd<'_>> = attached
            .iter()
            .filter_map(|s| match s.region.process() {
                true => own.memory.map(|m| m.as_fd()),
                false => s.region.fd(),
            })
            .collect();
        let msg = wire::encode_verdicts(&verdicts, fds.len());
        send_with_fds(stream.as_fd(), &msg, &fds)?;
    }
}
