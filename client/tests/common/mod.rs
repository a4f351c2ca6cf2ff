//! A scripted HTTP/1.1 server for exercising the client's wire behaviour without a real
//! Yutu node: each test says what to answer, and inspects what the client sent.
//!
//! It speaks just enough HTTP for ureq: Content-Length bodies, keep-alive, and
//! `Expect: 100-continue` (answered with `100 Continue`, unless the script refuses the
//! request up front, which is how a real server rejects a PUT before reading its body).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

/// A request as received; `body` is empty when the script refused it before the body.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    /// Raw request target: path and query, exactly as sent (still percent-encoded).
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    pub fn query(&self) -> Vec<(String, String)> {
        let Some((_, q)) = self.target.split_once('?') else {
            return vec![];
        };
        q.split('&')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                let dec = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .unwrap()
                        .into_owned()
                };
                (dec(k), dec(v))
            })
            .collect()
    }

    pub fn param(&self, name: &str) -> Option<String> {
        self.query()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// What to answer.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Answer before reading the request body, then close (a refused upload).
    pub early: bool,
    /// Send this Content-Length instead of the body's (HEAD answers).
    pub content_length: Option<u64>,
}

impl Resp {
    pub fn new(status: u16) -> Resp {
        Resp {
            status,
            headers: vec![],
            body: vec![],
            early: false,
            content_length: None,
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Resp {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }

    pub fn body(mut self, b: impl Into<Vec<u8>>) -> Resp {
        self.body = b.into();
        self
    }

    pub fn xml(self, b: &str) -> Resp {
        self.header("content-type", "application/xml").body(b)
    }

    pub fn s3_error(status: u16, code: &str, message: &str) -> Resp {
        Resp::new(status).xml(&format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><Resource>/x</Resource><RequestId>1</RequestId></Error>"
        ))
    }

    pub fn early(mut self) -> Resp {
        self.early = true;
        self
    }

    pub fn content_length(mut self, n: u64) -> Resp {
        self.content_length = Some(n);
        self
    }
}

type Script = dyn Fn(&Req) -> Resp + Send + Sync;

/// A running fake server. Dropping it leaves the listener thread parked on accept; the
/// process exit reclaims it.
pub struct FakeServer {
    pub url: String,
    log: Arc<Mutex<Vec<Req>>>,
}

impl FakeServer {
    pub fn start(script: impl Fn(&Req) -> Resp + Send + Sync + 'static) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let thread_log = log.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (script, log) = (script.clone(), thread_log.clone());
                thread::spawn(move || serve(stream, &*script, &log));
            }
        });
        FakeServer { url, log }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, script: &Script, log: &Mutex<Vec<Req>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let mut req = Req {
            method: method.to_string(),
            target: target.to_string(),
            headers: vec![],
            body: vec![],
        };
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                req.headers
                    .push((k.trim().to_lowercase(), v.trim().to_string()));
            }
        }
        let resp = script(&req);
        if resp.early {
            log.lock().unwrap().push(req);
            let _ = write_response(&mut writer, "GET", &resp, true);
            return;
        }
        if req
            .header("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        {
            let _ = writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let len: u64 = req
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = Vec::new();
        if (&mut reader).take(len).read_to_end(&mut body).is_err() {
            return;
        }
        req.body = body;
        let method = req.method.clone();
        log.lock().unwrap().push(req);
        if write_response(&mut writer, &method, &resp, false).is_err() {
            return;
        }
    }
}

fn write_response(
    w: &mut TcpStream,
    method: &str,
    resp: &Resp,
    close: bool,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Scripted\r\n", resp.status);
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let len = resp.content_length.unwrap_or(resp.body.len() as u64);
    head.push_str(&format!("content-length: {len}\r\n"));
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    if method != "HEAD" {
        w.write_all(&resp.body)?;
    }
    w.flush()
}

pub const LAST_MODIFIED: &str = "Thu, 01 Jan 2026 00:00:00 GMT";

/// Headers a real server puts on a GET/HEAD answer.
pub fn object_headers(resp: Resp, etag: &str) -> Resp {
    resp.header("etag", &format!("\"{etag}\""))
        .header("last-modified", LAST_MODIFIED)
        .header("content-type", "application/octet-stream")
}
