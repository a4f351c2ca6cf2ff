//! Owned wrappers around the ibverbs objects the transport uses: device context and
//! protection domain, completion queues, memory registrations and RC queue pairs.
//!
//! Each wrapper frees its object exactly once on drop and keeps what it depends on alive
//! (`Arc<Device>`), so the destruction order the verbs API requires (queue pairs and memory
//! registrations before the protection domain, the protection domain before the context) holds
//! whatever order Rust drops them in. libibverbs objects may be used from any thread, which is
//! what the `Send`/`Sync` impls rely on.

use std::ffi::CStr;
use std::sync::Arc;

use rdma_sys::*;

use super::handshake::QpInfo;
use super::RdmaError;
use crate::region::MemoryRegion;

/// `IBV_LINK_LAYER_ETHERNET` (a `#define`, not in the bindings): RoCE needs a GRH on every
/// packet, so the GID is always used there.
const LINK_LAYER_ETHERNET: u8 = 2;

/// An opened device port and its protection domain.
pub(crate) struct Device {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    pub(crate) name: String,
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) gid_index: u8,
    pub(crate) mtu: u8,
    pub(crate) ethernet: bool,
    /// Outstanding RDMA READs per queue pair, as both directions of the device allow.
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_qp_wr: u32,
}

// SAFETY: libibverbs contexts and protection domains are thread-safe; the fields that are not
// pointers are immutable after `open`.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// Frees the device list on every path out of `Device::open`.
struct DeviceList(*mut *mut ibv_device);

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; contexts opened
        // from it stay valid after it is freed (documented by libibverbs).
        unsafe { ibv_free_device_list(self.0) };
    }
}

impl Device {
    /// Opens `wanted` (or the first device with an active port).
    pub(crate) fn open(wanted: Option<&str>) -> Result<Device, RdmaError> {
        let mut count: std::os::raw::c_int = 0;
        // SAFETY: `count` is a valid out-pointer; a null result means no devices (or no verbs
        // support in the kernel at all).
        let list = unsafe { ibv_get_device_list(&mut count) };
        if list.is_null() {
            return Err(RdmaError::NoDevice);
        }
        let list = DeviceList(list);
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(RdmaError::NoDevice);
        }
        // SAFETY: libibverbs returns an array of `count` device pointers.
        let devices = unsafe { std::slice::from_raw_parts(list.0, count) };
        let mut named = false;
        let mut last = None;
        for &dev in devices {
            // SAFETY: `dev` comes from the live list; the name is a NUL-terminated string owned
            // by the device.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if wanted.is_some_and(|w| w != name) {
                continue;
            }
            named = true;
            match Device::open_one(dev, name) {
                Ok(device) => return Ok(device),
                Err(err) => last = Some(err),
            }
        }
        match wanted {
            Some(w) if !named => Err(RdmaError::DeviceNotFound(w.to_owned())),
            _ => Err(last.unwrap_or(RdmaError::NoDevice)),
        }
    }

    fn open_one(dev: *mut ibv_device, name: String) -> Result<Device, RdmaError> {
        // SAFETY: `dev` is a live entry of the device list.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(RdmaError::verbs("ibv_open_device"));
        }
        let close = |err: RdmaError| {
            // SAFETY: closing the context opened above, once, on an error path.
            unsafe { ibv_close_device(ctx) };
            err
        };
        // SAFETY: plain old data, filled by the call.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `attr` a valid out-pointer.
        if unsafe { ibv_query_device(ctx, &mut attr) } != 0 {
            return Err(close(RdmaError::verbs("ibv_query_device")));
        }
        let mut chosen = None;
        for port in 1..=attr.phys_port_cnt {
            // SAFETY: plain old data, filled by the call.
            let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: `ctx` is open, `port` within the device's ports, `pattr` an out-pointer.
            let rc = unsafe { ___ibv_query_port(ctx, port, &mut pattr) };
            if rc == 0 && pattr.state == ibv_port_state::IBV_PORT_ACTIVE {
                chosen = Some((port, pattr));
                break;
            }
        }
        let Some((port, pattr)) = chosen else {
            return Err(close(RdmaError::NoActivePort { device: name }));
        };
        let gid_index = 0u8;
        // SAFETY: plain old data, filled by the call.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` open, valid port and index, `gid` an out-pointer.
        if unsafe { ibv_query_gid(ctx, port, gid_index.into(), &mut gid) } != 0 {
            return Err(close(RdmaError::verbs("ibv_query_gid")));
        }
        // SAFETY: `ctx` is open.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(close(RdmaError::verbs("ibv_alloc_pd")));
        }
        let rd_atomic = attr
            .max_qp_rd_atom
            .min(attr.max_qp_init_rd_atom)
            .clamp(1, 16);
        Ok(Device {
            ctx,
            pd,
            name,
            port,
            lid: pattr.lid,
            // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
            gid: unsafe { gid.raw },
            gid_index,
            mtu: pattr.active_mtu as u8,
            ethernet: pattr.link_layer == LINK_LAYER_ETHERNET,
            max_rd_atomic: rd_atomic as u8,
            max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(1).max(1),
        })
    }

    /// Registers `region` for local and remote read/write access. A GPU region
    /// ([`MemoryRegion::device_memory`]) is registered by its device address, which the
    /// kernel accepts only with a peer-memory module (GPUDirect RDMA); without one the call
    /// fails (`EFAULT`) and nothing is registered.
    pub(crate) fn register(self: &Arc<Self>, region: &MemoryRegion) -> Result<Mr, RdmaError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: the region's memory (a host mapping, or device memory whose registrant
        // vouched for it) is valid for `len` bytes and stays so while the `Mr` (which holds a
        // clone of the region) exists; the pd is alive (held by `self`).
        let mr = unsafe {
            ibv_reg_mr(
                self.pd,
                region.as_ptr().cast(),
                region.len(),
                access.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(RdmaError::verbs("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            _region: region.clone(),
            _device: Arc::clone(self),
        })
    }

    pub(crate) fn create_cq(self: &Arc<Self>, depth: u32) -> Result<Cq, RdmaError> {
        // SAFETY: `ctx` is open; no completion channel, no context pointer.
        let cq = unsafe {
            ibv_create_cq(
                self.ctx,
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(RdmaError::verbs("ibv_create_cq"));
        }
        Ok(Cq {
            cq,
            _device: Arc::clone(self),
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every Mr, Cq and Qp holds an Arc<Device>, so none is left when this runs;
        // the pd and the context are released once, in the order the API requires.
        unsafe {
            ibv_dealloc_pd(self.pd);
            ibv_close_device(self.ctx);
        }
    }
}

/// A memory registration (keys for local and remote access to one region).
pub(crate) struct Mr {
    mr: *mut ibv_mr,
    _region: MemoryRegion,
    _device: Arc<Device>,
}

// SAFETY: the registration is only read after creation (keys, address); deregistration happens
// once, in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration.
        unsafe { (*self.mr).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }

    /// The registered range's first byte, as peers address it.
    pub(crate) fn addr(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.mr).addr as u64 }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistered once; lanes hold an Arc<Mr> while work requests that use it are
        // outstanding, so the NIC is done with it.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// A completion queue, polled by the worker that owns it.
pub(crate) struct Cq {
    cq: *mut ibv_cq,
    _device: Arc<Device>,
}

// SAFETY: a CQ may be polled from any thread; each one is polled by one lane at a time.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl Cq {
    /// Completions ready now, up to `wcs.len()`.
    pub(crate) fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize, RdmaError> {
        // SAFETY: `cq` is live and `wcs` has room for `len` entries.
        let n = unsafe { ibv_poll_cq(self.cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| RdmaError::verbs("ibv_poll_cq"))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after the queue pairs that use it (they hold an Arc<Cq>).
        unsafe { ibv_destroy_cq(self.cq) };
    }
}

/// One RDMA READ or WRITE to post.
#[derive(Clone, Copy)]
pub(crate) struct WorkItem {
    pub(crate) id: u64,
    pub(crate) read: bool,
    pub(crate) local_addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
}

/// A reliable-connected queue pair, in INIT after `create`, RTS after `connect`.
pub(crate) struct Qp {
    qp: *mut ibv_qp,
    pub(crate) cq: Arc<Cq>,
    device: Arc<Device>,
    psn: u32,
}

// SAFETY: a QP may be used from any thread; each one is driven by one lane or listener thread.
unsafe impl Send for Qp {}

impl Qp {
    pub(crate) fn create(device: &Arc<Device>, cq: Arc<Cq>, depth: u32) -> Result<Qp, RdmaError> {
        // SAFETY: plain old data; the fields that matter are set below.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.cq;
        init.recv_cq = cq.cq;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = depth.min(device.max_qp_wr);
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: pd and cq are live; `init` is fully initialised.
        let qp = unsafe { ibv_create_qp(device.pd, &mut init) };
        if qp.is_null() {
            return Err(RdmaError::verbs("ibv_create_qp"));
        }
        let psn = crate::sys::random_u64().unwrap_or(0) as u32 & 0x00ff_ffff;
        let qp = Qp {
            qp,
            cq,
            device: Arc::clone(device),
            psn,
        };
        // SAFETY: plain old data.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = device.port;
        attr.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        qp.modify(&mut attr, mask, "ibv_modify_qp(INIT)")?;
        Ok(qp)
    }

    /// This end's address, for the peer.
    pub(crate) fn info(&self) -> QpInfo {
        QpInfo {
            lid: self.device.lid,
            // SAFETY: `qp` is live; qp_num is immutable.
            qpn: unsafe { (*self.qp).qp_num },
            psn: self.psn,
            gid: self.device.gid,
            mtu: self.device.mtu,
        }
    }

    /// Connects to the peer's queue pair: INIT → RTR → RTS.
    pub(crate) fn connect(&self, remote: &QpInfo) -> Result<(), RdmaError> {
        let dev = &self.device;
        // SAFETY: plain old data.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = u32::from(dev.mtu.min(remote.mtu).max(1));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = dev.max_rd_atomic;
        attr.min_rnr_timer = 12;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = dev.port;
        if dev.ethernet || remote.gid != [0u8; 16] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = dev.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTR)")?;

        // SAFETY: plain old data.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.sq_psn = self.psn;
        attr.max_rd_atomic = dev.max_rd_atomic;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTS)")
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        call: &'static str,
    ) -> Result<(), RdmaError> {
        // SAFETY: `qp` is live and `attr` initialised for the fields in `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            // ibv_modify_qp returns the errno value rather than setting errno.
            return Err(RdmaError::Verbs { call, errno: rc });
        }
        Ok(())
    }

    /// Posts signalled one-sided READs and WRITEs; each completes with `wr_id = item.id`.
    pub(crate) fn post(&self, items: &[WorkItem]) -> Result<(), RdmaError> {
        if items.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ibv_sge> = items
            .iter()
            .map(|it| ibv_sge {
                addr: it.local_addr,
                length: it.len,
                lkey: it.lkey,
            })
            .collect();
        // SAFETY: plain old data; every field the provider reads is set below.
        let mut wrs: Vec<ibv_send_wr> = items
            .iter()
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let sge_base = sges.as_mut_ptr();
        let wr_base = wrs.as_mut_ptr();
        for (i, (wr, it)) in wrs.iter_mut().zip(items).enumerate() {
            wr.wr_id = it.id;
            // SAFETY: `i` indexes `sges`, which outlives the post call below.
            wr.sg_list = unsafe { sge_base.add(i) };
            wr.num_sge = 1;
            wr.opcode = if it.read {
                ibv_wr_opcode::IBV_WR_RDMA_READ
            } else {
                ibv_wr_opcode::IBV_WR_RDMA_WRITE
            };
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.wr = wr_t {
                rdma: rdma_t {
                    remote_addr: it.remote_addr,
                    rkey: it.rkey,
                },
            };
            wr.next = if i + 1 < items.len() {
                // SAFETY: `i + 1` indexes `wrs`.
                unsafe { wr_base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain of `wrs` and their `sges` is valid for the call (the provider copies
        // them into the send queue); the local buffers are registered (lkey) and stay mapped
        // until their completions are polled, which the lane waits for.
        let rc = unsafe { ibv_post_send(self.qp, wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(RdmaError::Verbs {
                call: "ibv_post_send",
                errno: rc,
            });
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; after this the NIC touches none of the buffers its work
        // requests named.
        unsafe { ibv_destroy_qp(self.qp) };
    }
}
