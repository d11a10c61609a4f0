//! Opening the RDMA device: device choice, port, GID, limits.

use crate::config::RdmaConfig;
use mori_io_core::{IoError, IoResult};
use sideway::ibverbs::address::Gid;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use std::net::Ipv6Addr;
use std::sync::Arc;

/// `ibv_port_state::IBV_PORT_ACTIVE`.
const PORT_ACTIVE: u32 = 4;
/// `ibv_query_gid_type` value of a RoCEv2 GID.
const GID_TYPE_ROCE_V2: u32 = 1;

/// The opened device and what the backend needs to know about it.
pub struct Device {
    /// Device name (e.g. `mlx5_0`, `rxe0`).
    pub name: String,
    /// Verbs context.
    pub ctx: Arc<DeviceContext>,
    /// Protection domain of every MR and QP of the backend.
    pub pd: Arc<ProtectionDomain>,
    /// Port number (1).
    pub port: u8,
    /// Local GID and its index.
    pub gid: Gid,
    /// Index of `gid` in the port's table.
    pub gid_index: u8,
    /// Local LID (0 on RoCE).
    pub lid: u16,
    /// Active path MTU (ibv_mtu value 1..=5).
    pub mtu: u32,
    /// Port's largest message, bytes.
    pub max_msg_sz: u64,
    /// Device's SGEs per WR.
    pub max_sge: u32,
    /// Device's WRs per QP.
    pub max_qp_wr: u32,
    /// Device's CQ entries.
    pub max_cqe: u32,
}

/// The sideway MTU of an `ibv_mtu` value (unknown values fall back to 1024).
pub fn mtu_of(v: u32) -> Mtu {
    match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

/// Device names in the order host memory prefers them (mori-topo: NUMA-local to the calling
/// CPU first, faster first), from sysfs under `root`; empty when sysfs says nothing.
pub fn preferred_order(root: &std::path::Path, filter: Option<&mori_topo::DeviceFilter>) -> (Vec<String>, Option<u32>) {
    let Ok(topo) = mori_topo::scan(root) else { return (Vec::new(), None) };
    // SAFETY: sched_getcpu has no arguments and only returns a number (or -1).
    let cpu = unsafe { libc::sched_getcpu() };
    let numa = (cpu >= 0).then(|| topo.numa_nodes.iter().find(|n| n.cpus.contains(&(cpu as u32))).map(|n| n.id)).flatten();
    let Ok(allowed) = mori_topo::allowed_nics(&topo, filter) else { return (Vec::new(), numa) };
    let h = mori_topo::host_nics(&topo, numa, &allowed);
    (h.nics.iter().map(|&i| topo.nics[i].name.clone()).collect(), numa)
}

/// Opens the first usable device: the NUMA-local, fastest ones first ([`preferred_order`]),
/// then any other device `MORI_RDMA_DEVICES` allows, taking the first whose port 1 is active.
/// Errors: `NotSupported` naming why: no libibverbs / no kernel RDMA, no device, no active port
/// (listing each device's port state), a bad filter, or an unusable GID index.
pub fn open(cfg: &RdmaConfig) -> IoResult<Device> {
    let filter = mori_topo::DeviceFilter::from_env().map_err(|e| IoError::invalid(e.to_string()))?;
    let list = DeviceList::new().map_err(|e| {
        IoError::not_supported(format!(
            "no RDMA: libibverbs could not list devices ({e}): no RDMA driver is loaded (or libibverbs is missing); \
             without an RDMA NIC, try SoftRoCE: cargo xtask softroce -- CMD"
        ))
    })?;
    let (order, numa) = preferred_order(std::path::Path::new("/"), filter.as_ref());
    let mut devs: Vec<_> = list.iter().collect();
    devs.sort_by_key(|d| order.iter().position(|n| *n == d.name()).unwrap_or(usize::MAX));
    let mut seen = Vec::new();
    for d in devs {
        let name = d.name();
        let allowed = match &filter {
            None => true,
            Some(mori_topo::DeviceFilter::Include(v)) => v.contains(&name),
            Some(mori_topo::DeviceFilter::Exclude(v)) => !v.contains(&name),
        };
        if !allowed {
            seen.push(format!("{name} (excluded by MORI_RDMA_DEVICES)"));
            continue;
        }
        let ctx = match d.open() {
            Ok(c) => c,
            Err(e) => {
                seen.push(format!("{name} (open failed: {e})"));
                continue;
            }
        };
        let port = match ctx.query_port(1) {
            Ok(p) => p,
            Err(e) => {
                seen.push(format!("{name} (port 1 query failed: {e})"));
                continue;
            }
        };
        if port.attr.state != PORT_ACTIVE {
            seen.push(format!("{name} (port 1 state {} is not ACTIVE)", port.attr.state));
            continue;
        }
        let dev = ctx.query_device().map_err(|e| IoError::transport(format!("{name}: query_device: {e}")))?;
        let (gid_index, gid) = choose_gid(&ctx, cfg.gid_index, port.attr.gid_tbl_len.max(0) as u32, &name)?;
        let pd = ctx.alloc_pd().map_err(|e| IoError::transport(format!("{name}: alloc_pd: {e}")))?;
        let local = order.first() == Some(&name) && numa.is_some();
        tracing::info!(
            device = %name, gid_index, gid = %gid, mtu = port.attr.active_mtu, numa = ?numa, numa_local = local,
            "rdma device opened"
        );
        return Ok(Device {
            name,
            pd,
            port: 1,
            gid,
            gid_index,
            lid: port.attr.lid,
            mtu: port.attr.active_mtu,
            max_msg_sz: u64::from(port.attr.max_msg_sz),
            max_sge: dev.max_sge().max(1) as u32,
            max_qp_wr: dev.max_qp_wr().max(2) as u32,
            max_cqe: dev.max_cqe().max(16) as u32,
            ctx,
        });
    }
    Err(IoError::not_supported(if seen.is_empty() {
        "no active RDMA port: no RDMA device found (without an RDMA NIC, try SoftRoCE: cargo xtask softroce -- CMD)".to_string()
    } else {
        format!("no active RDMA port: {}", seen.join("; "))
    }))
}

/// GID choice: the override if given (must be non-zero), else the first RoCEv2 GID that is an
/// IPv4-mapped address, else the first RoCEv2 non-link-local GID, else the first non-zero one.
fn choose_gid(ctx: &DeviceContext, want: Option<u8>, len: u32, dev: &str) -> IoResult<(u8, Gid)> {
    if let Some(i) = want {
        let g = ctx
            .query_gid(1, u32::from(i))
            .map_err(|e| IoError::invalid(format!("MORI_IB_GID_INDEX={i}: {dev} port 1 has no such GID ({e})")))?;
        if g.is_zero() {
            return Err(IoError::invalid(format!("MORI_IB_GID_INDEX={i}: GID {i} of {dev} is empty")));
        }
        return Ok((i, g));
    }
    let mut v4 = None;
    let mut v2 = None;
    let mut any = None;
    for i in 0..len.min(256) {
        let Ok(g) = ctx.query_gid(1, i) else { continue };
        if g.is_zero() {
            continue;
        }
        any.get_or_insert((i, g));
        if ctx.query_gid_type(1, i).ok() == Some(GID_TYPE_ROCE_V2) {
            if Ipv6Addr::from(g.raw).to_ipv4_mapped().is_some() {
                v4.get_or_insert((i, g));
            } else if !g.is_unicast_link_local() {
                v2.get_or_insert((i, g));
            }
        }
    }
    v4.or(v2)
        .or(any)
        .map(|(i, g)| (i as u8, g))
        .ok_or_else(|| IoError::not_supported(format!("{dev} port 1 has no usable GID (set MORI_IB_GID_INDEX)")))
}
