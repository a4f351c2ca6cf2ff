//! The RDMA handshake listener: connects a queue pair for each initiator and answers its
//! descriptor checks with memory keys. The queue pair lives as long as the TCP connection;
//! the target never posts work requests, the initiator's READs and WRITEs are served by the NIC.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use super::handshake::{self, Grant, QpInfo};
use super::lane::DEPTH;
use super::verbs::Qp;
use super::{RdmaError, RdmaShared};
use crate::descriptor::{Access, NodeId, SegmentDescriptor};
use crate::error::Refusal;
use crate::segment::SegmentTable;
use crate::stats::ListenerCounters;
use crate::transport::serve::Server;

pub(crate) struct RdmaListener {
    pub(crate) addr: SocketAddr,
    _server: Server,
}

pub(crate) struct Target {
    pub(crate) node: NodeId,
    pub(crate) incarnation: u64,
    pub(crate) idle_timeout: Duration,
}

impl RdmaListener {
    pub(crate) fn start(
        bind: SocketAddr,
        shared: Arc<RdmaShared>,
        segments: Arc<SegmentTable>,
        target: Target,
        max_connections: usize,
        counters: Arc<ListenerCounters>,
    ) -> Result<RdmaListener, RdmaError> {
        let fail = |e: io::Error| RdmaError::Handshake(format!("cannot listen on {bind}: {e}"));
        let listener = TcpListener::bind(bind).map_err(fail)?;
        let addr = listener.local_addr().map_err(fail)?;
        let mut wake = addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let serve_counters = Arc::clone(&counters);
        let listening = listener.as_fd().try_clone_to_owned().map_err(fail)?;
        let server = Server::spawn(
            "yutu-rdma-listen",
            listening,
            move || listener.accept().map(|(s, _)| s),
            move |stream: TcpStream| {
                if let Err(err) = serve(stream, &shared, &segments, &target, &serve_counters) {
                    tracing::debug!(%err, "rdma handshake connection ended");
                }
            },
            move || {
                let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
            },
            max_connections,
            counters,
        )
        .map_err(fail)?;
        Ok(RdmaListener {
            addr,
            _server: server,
        })
    }
}

fn serve(
    mut stream: TcpStream,
    shared: &RdmaShared,
    segments: &SegmentTable,
    target: &Target,
    counters: &ListenerCounters,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(target.idle_timeout))?;
    stream.set_write_timeout(Some(target.idle_timeout))?;
    let mut hello = [0u8; handshake::HELLO_LEN];
    stream.read_exact(&mut hello)?;
    let (node, remote) = handshake::decode_hello(&hello)
        .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
    let nothing = QpInfo {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: [0; 16],
        mtu: 0,
    };
    if node != target.node {
        let reply = handshake::encode_reply(
            Err(Refusal::WrongNode),
            target.node,
            target.incarnation,
            &nothing,
        );
        return stream.write_all(&reply);
    }
    // The queue pair must outlive every READ/WRITE the initiator posts: it lives until this
    // connection ends.
    let qp = match connect_qp(shared, &remote) {
        Ok(qp) => qp,
        Err(err) => {
            tracing::warn!(%err, "cannot set up an rdma queue pair for a peer");
            let reply = handshake::encode_reply(
                Err(Refusal::NotShareable),
                target.node,
                target.incarnation,
                &nothing,
            );
            return stream.write_all(&reply);
        }
    };
    stream.write_all(&handshake::encode_reply(
        Ok(()),
        target.node,
        target.incarnation,
        &qp.info(),
    ))?;
    loop {
        let mut header = [0u8; handshake::HEADER_LEN];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let count = handshake::decode_check_header(&header)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
        let mut body = vec![0u8; count * SegmentDescriptor::ENCODED_LEN];
        stream.read_exact(&mut body)?;
        let grants: Vec<Grant> = body
            .chunks_exact(SegmentDescriptor::ENCODED_LEN)
            .map(|raw| {
                ListenerCounters::add(&counters.requests, 1);
                let grant = grant_for(raw, shared, segments);
                if grant.status.is_err() {
                    ListenerCounters::add(&counters.refused, 1);
                }
                grant
            })
            .collect();
        stream.write_all(&handshake::encode_grants(&grants))?;
    }
}

fn connect_qp(shared: &RdmaShared, remote: &QpInfo) -> Result<Qp, RdmaError> {
    let cq = Arc::new(shared.device.create_cq(4)?);
    let qp = Qp::create(&shared.device, cq, DEPTH)?;
    qp.connect(remote)?;
    Ok(qp)
}

fn grant_for(raw: &[u8], shared: &RdmaShared, segments: &SegmentTable) -> Grant {
    let refused = |reason| Grant {
        status: Err(reason),
        segment_len: 0,
        addr: 0,
        rkey: 0,
    };
    let Ok(desc) = SegmentDescriptor::decode(raw) else {
        return refused(Refusal::BadRequest);
    };
    // The remote key covers the whole registration, so the peer gets read and write access
    // to all of it: only for unguarded segments (a guarded one would need a memory window
    // per grant, which this transport does not bind yet).
    let entry = match segments.check_descriptor(&desc, desc.access) {
        Ok(entry) if entry.guard.is_some() => return refused(Refusal::NotShareable),
        Ok(_) if desc.access != Access::ReadWrite => return refused(Refusal::WrongAccess),
        Ok(entry) => entry,
        Err(reason) => return refused(reason),
    };
    let Some(mr) = shared.mr(entry.id) else {
        return refused(Refusal::NotShareable);
    };
    Grant {
        status: Ok(()),
        segment_len: entry.region.len() as u64,
        addr: mr.addr(),
        rkey: mr.rkey(),
    }
}
