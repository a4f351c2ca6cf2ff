//! Handing a presence table's memfd to the caller it was granted to.
//!
//! A descriptor crosses processes only as `SCM_RIGHTS` ancillary data on a Unix socket, and
//! the frame connections are glommio streams, which send no ancillary data. So a grant opens
//! a one-time listener on a random abstract name and answers its name with a random nonce;
//! the caller connects, sends the nonce and receives the descriptor with one byte. Abstract
//! names can be seen by every process of the host, so the nonce is what proves the caller:
//! only the grant's answer, on the caller's own connection, carries it. The listener takes
//! at most [`MAX_PENDING`] connections at once (a process that connects and sends nothing
//! cannot hold it up), closes each that sends a wrong nonce, and goes after one hand-over or
//! after [`PRESENCE_HANDOFF_TIMEOUT_MS`], whichever comes first; a shard has at most
//! [`MAX_OPEN_PER_SHARD`] open at once.
//!
//! The shard polls the listener with a growing pause (20 µs to 2 ms) instead of waiting in
//! the reactor: glommio cannot wait on a socket it did not open, and a grant happens once
//! per bucket, shard and client.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use yutu_api::kv_frame::PRESENCE_HANDOFF_TIMEOUT_MS;

/// Connections a hand-over listener reads nonces from at once.
pub const MAX_PENDING: usize = 8;
/// Hand-overs one shard has open at once; a grant past them is refused (the client asks the
/// node instead), so a caller asking for grants in a loop holds at most this many sockets.
pub const MAX_OPEN_PER_SHARD: usize = 64;

thread_local! {
    /// Hand-overs open on this shard's thread.
    static OPEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a hand-over open for as long as it lives.
struct Open;

impl Open {
    fn take() -> Option<Open> {
        OPEN.with(|n| {
            (n.get() < MAX_OPEN_PER_SHARD).then(|| {
                n.set(n.get() + 1);
                Open
            })
        })
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        OPEN.with(|n| n.set(n.get().saturating_sub(1)));
    }
}
const FIRST_PAUSE: Duration = Duration::from_micros(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(2);

/// Where and how the caller collects the descriptor.
pub struct Handoff {
    pub socket: String,
    pub nonce: [u8; 16],
}

/// Offers `fd` on a new one-time socket, served by a task on this shard. `WouldBlock` when
/// the shard has [`MAX_OPEN_PER_SHARD`] hand-overs open.
pub fn offer(fd: OwnedFd) -> std::io::Result<Handoff> {
    let open = Open::take().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "too many presence tables waiting to be collected on this shard",
        )
    })?;
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(std::io::Error::other)?;
    let socket = format!(
        "yutu-presence-{}",
        random[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&random[16..]);
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(socket.as_bytes())?)?;
    listener.set_nonblocking(true)?;
    glommio::spawn_local(async move {
        hand_over(listener, nonce, fd).await;
        drop(open);
    })
    .detach();
    Ok(Handoff { socket, nonce })
}

/// A connection and the nonce bytes it sent so far.
struct Pending {
    stream: UnixStream,
    got: Vec<u8>,
}

async fn hand_over(listener: UnixListener, nonce: [u8; 16], fd: OwnedFd) {
    let deadline = Instant::now() + Duration::from_millis(PRESENCE_HANDOFF_TIMEOUT_MS);
    let mut pending: Vec<Pending> = Vec::new();
    let mut pause = FIRST_PAUSE;
    while Instant::now() < deadline {
        let mut moved = false;
        while pending.len() < MAX_PENDING {
            match listener.accept() {
                Ok((stream, _)) if stream.set_nonblocking(true).is_ok() => {
                    pending.push(Pending {
                        stream,
                        got: Vec::new(),
                    });
                    moved = true;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let mut buf = [0u8; 16];
            let want = nonce.len() - p.got.len();
            match p.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    pending.swap_remove(i);
                    continue;
                }
                Ok(n) => {
                    moved = true;
                    p.got.extend_from_slice(&buf[..n]);
                    if p.got.len() == nonce.len() {
                        if same(&p.got, &nonce) {
                            let sent = yutu_transfer::fdpass::send_with_fds_now(
                                p.stream.as_fd(),
                                b"Y",
                                &[fd.as_fd()],
                            );
                            if let Err(e) = sent {
                                tracing::debug!(error = %e, "cannot hand over a presence table");
                            }
                            return;
                        }
                        tracing::debug!("a presence hand-over connection sent a wrong nonce");
                        pending.swap_remove(i);
                        continue;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    pending.swap_remove(i);
                    continue;
                }
            }
            i += 1;
        }
        pause = if moved {
            FIRST_PAUSE
        } else {
            (pause * 2).min(LONGEST_PAUSE)
        };
        glommio::timer::sleep(pause).await;
    }
    tracing::debug!("a presence table was granted but not collected in time");
}

/// Compares in time independent of where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
