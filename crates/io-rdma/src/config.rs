//! Settings of the RDMA backend and the upstream environment variables that set them.

use mori_io_core::{IoError, IoResult};
use std::time::Duration;

/// How completions are reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// The completion thread (or a waiter spinning on a transfer, which the thread then
    /// leaves the CQ to) spins on the CQ while completions come, and for
    /// [`RdmaConfig::poll_spin`] after the last one; then it arms the CQ and sleeps on its
    /// completion channel until the next (an idle engine burns no CPU, and on small machines,
    /// such as SoftRoCE guests, the spinning does not starve the NIC's own work).
    Polling,
    /// The completion thread arms the CQ and sleeps on its completion channel
    /// (`ibv_req_notify_cq` / `ibv_get_cq_event`): no CPU while idle, a wake-up per event.
    Event,
}

/// Settings of the RDMA backend.
///
/// | field | default | environment |
/// |---|---|---|
/// | `qps_per_transfer` | 4 | (bench `--num-qp-per-transfer`) |
/// | `max_send_wr` | 1024 (capped by the device) | `MORI_IO_QP_MAX_SEND_WR` |
/// | `max_cqe` | 65536 (capped by the device) | `MORI_IO_QP_MAX_CQE` |
/// | `max_msg_sge` | 8 (capped by the device) | `MORI_IO_QP_MAX_MSG_SGE` |
/// | `traffic_class` | 0 | `MORI_IO_TC` |
/// | `service_level` | 0 | `MORI_IO_SL` |
/// | `nics_per_transfer` | 1 | `MORI_IO_NUM_NICS_PER_TRANSFER` (only 1 in this build) |
/// | `gid_index` | auto: RoCEv2 IPv4-mapped first | `MORI_IB_GID_INDEX` |
/// | device | first with an active port | `MORI_RDMA_DEVICES` (`a,b` or `^a,b`) |
/// | `sq_timeout` | 10 s | `MORI_IO_SQ_BACKOFF_TIMEOUT_US` |
/// | `poll_spin` | 200 µs | `MORI_IO_POLL_SPIN_US` |
/// | `mr_budget` | 1 TiB | `MORI_IO_MR_BUDGET_BYTES` |
/// | chunking | on, 64 KiB, 64 chunks | (bench `--disable-chunking`, `--chunk-bytes`, `--max-chunks`) |
/// | `dmabuf` | the GPU runtime | (GPU memory's dmabuf exporter) |
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// RC queue pairs per peer that a transfer is spread over (1..=64).
    pub qps_per_transfer: usize,
    /// Send-queue depth per QP.
    pub max_send_wr: u32,
    /// Completion-queue entries.
    pub max_cqe: u32,
    /// Scatter-gather entries per work request.
    pub max_msg_sge: u32,
    /// GRH traffic class (leave 0 unless PFC is configured end to end).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// NICs a transfer is striped over.
    pub nics_per_transfer: usize,
    /// GID index override.
    pub gid_index: Option<u8>,
    /// How long a post waits for send-queue room before failing with `Timeout`.
    pub sq_timeout: Duration,
    /// Split single transfers into chunks.
    pub chunking: bool,
    /// Chunk size, bytes.
    pub chunk_bytes: u64,
    /// Most chunks per transfer.
    pub max_chunks: usize,
    /// Completion reaping mode.
    pub poll_mode: PollMode,
    /// Polling mode: how long the completion thread keeps spinning on an empty CQ after the
    /// last completion before it sleeps on the completion channel (0 = sleep at once; at most
    /// 10 s). Ignored in event mode.
    pub poll_spin: Duration,
    /// Budget of the registration cache, bytes (`MORI_IO_MR_BUDGET_BYTES`; default 1 TiB):
    /// registrations beyond it fail with a message naming the budget.
    pub mr_budget: u64,
    /// Posting workers the planner splits a batch over when chunking is off (the seed's
    /// `--num-worker-threads`: keeps merged WRs under max_msg_sz). 1..=64.
    pub workers: usize,
    /// Where GPU memory's dmabufs come from (registration of `MemLoc::Gpu` memory exports the
    /// range as a dmabuf and registers it with `ibv_reg_dmabuf_mr`). `None` (the default):
    /// the GPU runtime, CUDA or HIP, loaded at the first GPU registration.
    pub dmabuf: Option<crate::DmabufSource>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            qps_per_transfer: 4,
            max_send_wr: 1024,
            max_cqe: 65536,
            max_msg_sge: 8,
            traffic_class: 0,
            service_level: 0,
            nics_per_transfer: 1,
            gid_index: None,
            sq_timeout: Duration::from_secs(10),
            chunking: true,
            chunk_bytes: 65536,
            max_chunks: 64,
            poll_mode: PollMode::Polling,
            poll_spin: Duration::from_micros(200),
            workers: 1,
            mr_budget: 1 << 40,
            dmabuf: None,
        }
    }
}

/// Largest `MORI_IO_POLL_SPIN_US` (10 s).
pub const MAX_POLL_SPIN_US: u64 = 10_000_000;

/// Largest `MORI_IO_SL`: an InfiniBand service level has 4 bits.
pub const MAX_SERVICE_LEVEL: u8 = 15;

/// Largest GID index (`MORI_IB_GID_INDEX`): the GRH's source GID index (`sgid_index` of
/// `ibv_global_route`) is 8 bits. The port's GID table, which may be shorter, is checked when
/// the device is opened.
pub const MAX_GID_INDEX: u8 = u8::MAX;

fn env_num<T: std::str::FromStr>(var: &str) -> IoResult<Option<T>> {
    match std::env::var(var) {
        Ok(v) => v.trim().parse::<T>().map(Some).map_err(|_| IoError::invalid(format!("{var}={v:?} is not a valid number"))),
        Err(_) => Ok(None),
    }
}

/// A `MORI_IB_GID_INDEX` value: a whole number in 0..=[`MAX_GID_INDEX`].
/// Errors: `InvalidArgs` naming the variable, the value and the range.
pub fn parse_gid_index(v: &str) -> IoResult<u8> {
    v.trim().parse::<u8>().map_err(|_| {
        IoError::invalid(format!("MORI_IB_GID_INDEX={v:?} is not a GID index in 0..={MAX_GID_INDEX} (the GRH's sgid_index is 8 bits)"))
    })
}

impl RdmaConfig {
    /// Defaults overridden by the upstream environment variables (table above).
    /// Errors: `InvalidArgs` naming a variable that does not parse.
    pub fn from_env() -> IoResult<Self> {
        let mut c = RdmaConfig::default();
        if let Some(v) = env_num("MORI_IO_QP_MAX_SEND_WR")? {
            c.max_send_wr = v;
        }
        if let Some(v) = env_num("MORI_IO_QP_MAX_CQE")? {
            c.max_cqe = v;
        }
        if let Some(v) = env_num("MORI_IO_QP_MAX_MSG_SGE")? {
            c.max_msg_sge = v;
        }
        if let Some(v) = env_num("MORI_IO_TC")? {
            c.traffic_class = v;
        }
        if let Some(v) = env_num("MORI_IO_SL")? {
            c.service_level = v;
        }
        if let Some(v) = env_num("MORI_IO_NUM_NICS_PER_TRANSFER")? {
            c.nics_per_transfer = v;
        }
        if let Ok(v) = std::env::var("MORI_IB_GID_INDEX") {
            c.gid_index = Some(parse_gid_index(&v)?);
        }
        if let Some(v) = env_num("MORI_IO_MR_BUDGET_BYTES")? {
            c.mr_budget = v;
        }
        if let Some(v) = env_num::<u64>("MORI_IO_SQ_BACKOFF_TIMEOUT_US")? {
            c.sq_timeout = Duration::from_micros(v);
        }
        if let Some(v) = env_num::<u64>("MORI_IO_POLL_SPIN_US")? {
            c.poll_spin = Duration::from_micros(v);
        }
        Ok(c)
    }

    /// Checks the ranges. Errors: `InvalidArgs` naming the field and its limit; `NotSupported`
    /// for several NICs per transfer (not in this build).
    pub fn validate(&self) -> IoResult<()> {
        if !(1..=64).contains(&self.qps_per_transfer) {
            return Err(IoError::invalid(format!("rdma qps_per_transfer = {}, allowed 1..=64", self.qps_per_transfer)));
        }
        if !(1..=64).contains(&self.workers) {
            return Err(IoError::invalid(format!("rdma workers (num-worker-threads) = {}, allowed 1..=64", self.workers)));
        }
        if self.max_send_wr < 2 || self.max_cqe < 16 || self.max_msg_sge == 0 {
            return Err(IoError::invalid(format!(
                "rdma max_send_wr {} (>= 2), max_cqe {} (>= 16), max_msg_sge {} (>= 1)",
                self.max_send_wr, self.max_cqe, self.max_msg_sge
            )));
        }
        if self.nics_per_transfer != 1 {
            return Err(IoError::not_supported(format!(
                "MORI_IO_NUM_NICS_PER_TRANSFER={}: striping over several NICs is not in this build (use 1)",
                self.nics_per_transfer
            )));
        }
        if self.poll_spin > Duration::from_micros(MAX_POLL_SPIN_US) {
            return Err(IoError::invalid(format!(
                "rdma poll_spin (MORI_IO_POLL_SPIN_US) = {} µs, allowed 0..={MAX_POLL_SPIN_US}",
                self.poll_spin.as_micros()
            )));
        }
        if self.service_level > MAX_SERVICE_LEVEL {
            return Err(IoError::invalid(format!(
                "rdma service_level (MORI_IO_SL) = {}, allowed 0..={MAX_SERVICE_LEVEL}",
                self.service_level
            )));
        }
        if self.chunking && (self.chunk_bytes == 0 || self.max_chunks == 0) {
            return Err(IoError::invalid("rdma chunking needs chunk_bytes > 0 and max_chunks > 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_spin_defaults_to_200_us_and_is_bounded() {
        let c = RdmaConfig::default();
        assert_eq!((c.poll_mode, c.poll_spin), (PollMode::Polling, Duration::from_micros(200)));
        assert!(c.validate().is_ok());
        assert!(RdmaConfig { poll_spin: Duration::ZERO, ..c.clone() }.validate().is_ok());
        assert!(RdmaConfig { service_level: 16, ..c.clone() }.validate().unwrap_err().msg.contains("MORI_IO_SL"));
        let e = RdmaConfig { poll_spin: Duration::from_secs(11), ..c }.validate().unwrap_err();
        assert_eq!(e.code, mori_io_core::ErrorCode::InvalidArgs);
        assert!(e.msg.contains("poll_spin (MORI_IO_POLL_SPIN_US) = 11000000 µs, allowed 0..=10000000"), "{e}");
    }

    #[test]
    fn gid_index_is_8_bits_and_never_truncated() {
        assert_eq!(parse_gid_index(" 3 ").unwrap(), 3);
        assert_eq!(parse_gid_index("255").unwrap(), MAX_GID_INDEX);
        for bad in ["256", "259", "-1", "x1", ""] {
            let e = parse_gid_index(bad).unwrap_err();
            assert_eq!(e.code, mori_io_core::ErrorCode::InvalidArgs);
            assert!(e.msg.contains("MORI_IB_GID_INDEX") && e.msg.contains("0..=255"), "{e}");
        }
    }
}
