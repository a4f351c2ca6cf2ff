//! A TCP proxy on loopback that a test can cut and heal: a network partition between one
//! process and another without touching the host's network.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

fn pipe(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Proxy {
    /// Forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (c, s, o) = (cut.clone(), stop.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                if c.load(Ordering::SeqCst) {
                    // Cut: the connection is accepted and dropped, as a partition would
                    // never answer; the caller's deadline fires.
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                    continue;
                };
                if let Ok(mut open) = o.lock() {
                    open.extend(client.try_clone().ok());
                    open.extend(server.try_clone().ok());
                }
                let (c1, c2) = (c.clone(), c.clone());
                let (client2, server2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => continue,
                };
                std::thread::spawn(move || pipe(client, server, c1));
                std::thread::spawn(move || pipe(server2, client2, c2));
            }
        });
        Proxy {
            addr,
            cut,
            stop,
            open,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts every connection and refuses to carry new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut open) = self.open.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Carries new connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}
