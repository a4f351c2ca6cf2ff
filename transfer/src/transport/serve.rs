//! The accept loop every listener shares: one thread accepting, one thread per connection.
//!
//! Threads rather than an event loop because a connection spends its life in large blocking
//! copies between a socket and a mapping, and because the storage node's shards must not be
//! involved (glommio executors, one per core): these threads are the only ones that touch the
//! bytes on the target side. Connections are bounded (`max_connections`); one that breaks,
//! stalls past its timeout or sends garbage ends its own thread and nothing else.
//!
//! Stopping is deterministic: dropping the [`Server`] sets a flag, wakes the accept call with
//! a throwaway connection, joins the accept thread and shuts down every open connection's
//! socket so that their threads return from blocking reads.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::stats::{ActiveGuard, ListenerCounters};

/// Stack of a connection thread: they only shuffle buffers, never recurse.
const CONN_STACK: usize = 256 << 10;

/// A running listener.
pub(crate) struct Server {
    shutdown: Arc<AtomicBool>,
    /// Our duplicate of the listening socket, to wake a blocked `accept`.
    listening: OwnedFd,
    open: Arc<Mutex<HashMap<u64, OwnedFd>>>,
    wake: Option<Box<dyn FnOnce() + Send + Sync>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts accepting with `accept` (on `listening`, a duplicate of the listening socket) and serving each connection with `serve`
    /// on its own thread. `wake` should make a pending `accept` return (connect to the
    /// listener); shutting the listening socket down does the same on Linux, and the two cover
    /// each other (a removed socket file, a full backlog).
    pub(crate) fn spawn<S, A, H, W>(
        name: &str,
        listening: OwnedFd,
        mut accept: A,
        serve: H,
        wake: W,
        max_connections: usize,
        counters: Arc<ListenerCounters>,
    ) -> io::Result<Server>
    where
        S: AsFd + Send + 'static,
        A: FnMut() -> io::Result<S> + Send + 'static,
        H: Fn(S) + Send + Sync + 'static,
        W: FnOnce() + Send + Sync + 'static,
    {
        let shutdown = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<HashMap<u64, OwnedFd>>> = Arc::new(Mutex::new(HashMap::new()));
        let serve = Arc::new(serve);
        let conn_name = format!("{name}-conn");
        let thread = {
            let shutdown = Arc::clone(&shutdown);
            let open = Arc::clone(&open);
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    let next_id = AtomicU64::new(0);
                    loop {
                        let conn = accept();
                        if shutdown.load(Ordering::Acquire) {
                            break;
                        }
                        let conn = match conn {
                            Ok(conn) => conn,
                            Err(err) => {
                                tracing::warn!(%err, "accept failed");
                                // Out of descriptors or memory: back off instead of spinning.
                                std::thread::sleep(std::time::Duration::from_millis(10));
                                continue;
                            }
                        };
                        if counters.active.load(Ordering::Relaxed) as usize >= max_connections {
                            ListenerCounters::add(&counters.rejected, 1);
                            continue; // dropping `conn` closes it
                        }
                        let Ok(dup) = conn.as_fd().try_clone_to_owned() else {
                            continue;
                        };
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        lock(&open).insert(id, dup);
                        let guard = ActiveGuard::new(Arc::clone(&counters));
                        let serve = Arc::clone(&serve);
                        let open_for_conn = Arc::clone(&open);
                        let spawned = std::thread::Builder::new()
                            .name(conn_name.clone())
                            .stack_size(CONN_STACK)
                            .spawn(move || {
                                let _guard = guard;
                                serve(conn);
                                lock(&open_for_conn).remove(&id);
                            });
                        if spawned.is_err() {
                            lock(&open).remove(&id);
                        }
                    }
                })?
        };
        Ok(Server {
            shutdown,
            listening,
            open,
            wake: Some(Box::new(wake)),
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
        // SAFETY: shutting down our duplicate of the listening socket only makes a blocked
        // accept return with an error; the fd stays open until `self` is dropped.
        unsafe { libc::shutdown(self.listening.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(wake) = self.wake.take() {
            wake();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for fd in lock(&self.open).values() {
            // SAFETY: `fd` is our own duplicate of a connected socket; shutting it down only
            // makes the connection thread's blocking read or write return.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Drops `server` on another thread and waits (bounded) for the drop to finish.
    fn stops(server: Server) -> bool {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(30)).is_ok()
    }

    /// Shutting the listening socket down is enough to stop the accept thread, even when the
    /// wake-up connection cannot be made (socket file removed, backlog full).
    #[test]
    fn stops_without_a_wake_up_connection() {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let counters = Arc::new(ListenerCounters::default());
        let server = Server::spawn(
            "t-tcp",
            tcp.as_fd().try_clone_to_owned().unwrap(),
            move || tcp.accept().map(|(s, _)| s),
            |_s: TcpStream| {},
            || {},
            4,
            Arc::clone(&counters),
        )
        .unwrap();
        drop(TcpStream::connect(addr).unwrap());
        assert!(stops(server));

        let dir = tempfile::tempdir().unwrap();
        let unix = UnixListener::bind(dir.path().join("s")).unwrap();
        let server = Server::spawn(
            "t-unix",
            unix.as_fd().try_clone_to_owned().unwrap(),
            move || unix.accept().map(|(s, _)| s),
            |_s: UnixStream| {},
            || {},
            4,
            counters,
        )
        .unwrap();
        std::fs::remove_file(dir.path().join("s")).unwrap();
        assert!(stops(server));
    }

    /// Open connections are shut down too, so their threads end.
    #[test]
    fn stopping_closes_open_connections() {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let counters = Arc::new(ListenerCounters::default());
        let server = Server::spawn(
            "t-conn",
            tcp.as_fd().try_clone_to_owned().unwrap(),
            move || tcp.accept().map(|(s, _)| s),
            |mut s: TcpStream| {
                let mut buf = [0u8; 1];
                // Blocks until the server shuts the socket down.
                let _ = std::io::Read::read(&mut s, &mut buf);
            },
            move || {
                let _ = TcpStream::connect(addr);
            },
            4,
            Arc::clone(&counters),
        )
        .unwrap();
        let _client = TcpStream::connect(addr).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while counters.active.load(Ordering::Relaxed) != 1 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::yield_now();
        }
        assert!(stops(server));
        while counters.active.load(Ordering::Relaxed) != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "connection thread still running"
            );
            std::thread::yield_now();
        }
    }
}
