//! RC queue pairs: creation, the handshake messages, and the RESET -> INIT -> RTR -> RTS walk.

use crate::device::{mtu_of, Device};
use mori_io_core::{IoError, IoResult};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairState};
use sideway::ibverbs::AccessFlags;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

/// One QP's address as the peer needs it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// Initial send packet sequence number (24 bits).
    pub psn: u32,
}

/// One side of a connection: port address plus its QPs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    /// Port GID.
    pub gid: [u8; 16],
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU (ibv_mtu value).
    pub mtu: u32,
    /// Port's largest message, bytes.
    pub max_msg_sz: u64,
    /// The QPs, in lane order.
    pub qps: Vec<QpInfo>,
}

/// Control messages of the RDMA backend (postcard over the engine's control plane).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RdmaCtrl {
    /// Initiator -> target: connect these QPs (connection `conn_id` of that initiator).
    Connect {
        /// Initiator-chosen connection id.
        conn_id: u64,
        /// Initiator's endpoint.
        ep: Endpoint,
    },
    /// Target -> initiator: the matching QPs, already in RTS.
    Accepted(Endpoint),
}

/// QP attribute values the handshake uses.
pub struct QpParams {
    /// GRH traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_sge: u32,
}

/// A set of connected QPs to one peer.
pub struct Conn {
    /// Peer engine key.
    pub peer: String,
    /// Lanes.
    pub qps: Vec<Mutex<BasicQueuePair>>,
    /// WRs posted and not yet reclaimed, per QP (send-queue admission).
    pub outstanding: Vec<AtomicUsize>,
    /// Set after an error completion: the QPs are in the error state; reconnect.
    pub broken: AtomicBool,
    /// min(local, remote) port max_msg_sz.
    pub max_msg_sz: u64,
}

/// Creates `n` RC QPs on `cq` and moves them to INIT.
pub fn create_qps(dev: &Device, cq: &Arc<BasicCompletionQueue>, n: usize, p: &QpParams) -> IoResult<Vec<BasicQueuePair>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut b = dev.pd.create_qp_builder();
        let qp = b
            .setup_send_cq(GenericCompletionQueue::from(cq.clone()))
            .setup_recv_cq(GenericCompletionQueue::from(cq.clone()))
            .setup_max_send_wr(p.max_send_wr)
            .setup_max_recv_wr(p.max_recv_wr)
            .setup_max_send_sge(p.max_sge)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(64)
            .build()
            .map_err(|e| IoError::transport(format!("{}: create QP {i}: {e}", dev.name)))?;
        out.push(qp);
    }
    for (i, qp) in out.iter_mut().enumerate() {
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(dev.port)
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead);
        qp.modify(&a).map_err(|e| IoError::transport(format!("{}: QP {i} to INIT: {e}", dev.name)))?;
    }
    Ok(out)
}

/// This side's endpoint for `qps` with their PSNs.
pub fn endpoint(dev: &Device, qps: &[BasicQueuePair], psns: &[u32]) -> Endpoint {
    Endpoint {
        gid: dev.gid.raw,
        lid: dev.lid,
        mtu: dev.mtu,
        max_msg_sz: dev.max_msg_sz,
        qps: qps.iter().zip(psns).map(|(q, &psn)| QpInfo { qpn: q.qp_number(), psn }).collect(),
    }
}

/// Moves `qps` to RTR then RTS against `remote`. Errors name the QP and the state.
pub fn connect_qps(dev: &Device, qps: &mut [BasicQueuePair], psns: &[u32], remote: &Endpoint, p: &QpParams) -> IoResult<()> {
    if remote.qps.len() != qps.len() {
        return Err(IoError::invalid(format!("peer offers {} QPs, {} expected", remote.qps.len(), qps.len())));
    }
    let mtu = mtu_of(dev.mtu.min(remote.mtu));
    for (i, qp) in qps.iter_mut().enumerate() {
        let r = remote.qps[i];
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid).setup_port(dev.port).setup_service_level(p.service_level).setup_grh(
            &Gid { raw: remote.gid },
            0,
            dev.gid_index,
            64,
            p.traffic_class,
        );
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(r.qpn)
            .setup_rq_psn(r.psn)
            .setup_max_dest_read_atomic(16)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&ah);
        qp.modify(&a).map_err(|e| IoError::transport(format!("{}: QP {i} to RTR (dest QPN {}): {e}", dev.name, r.qpn)))?;
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(psns[i])
            .setup_timeout(14)
            // 6, not 7: rdma_rxe treats 7 as "retry forever" (only rnr_retry means that in the
            // spec), so a dead peer would never produce an error completion there.
            .setup_retry_cnt(6)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(16);
        qp.modify(&a).map_err(|e| IoError::transport(format!("{}: QP {i} to RTS: {e}", dev.name)))?;
    }
    Ok(())
}

/// A pseudo-random 24-bit PSN (from the clock and a counter; PSNs need not be secret).
pub fn psn(i: usize) -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    (t.wrapping_mul(2654435761).wrapping_add(i as u32 * 40503)) & 0x00ff_ffff
}
