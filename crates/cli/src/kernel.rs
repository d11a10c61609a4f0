//! The EP kernels of the MORI-EP profiler traces: names, lanes and phase order (the MORI-EP
//! guide's lane table and the RDMA-utilization note's execution path).

use serde::Serialize;

/// Where a kernel is drawn and aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// Full-height, one at a time.
    Serial,
    /// RDMA blocks.
    Internode,
    /// XGMI/NVLink blocks.
    Intranode,
    /// A name outside the seed's lists.
    Other,
}

/// The EP kernels of one dispatch+combine iteration, in phase order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// `dispatch_layout` (mori-rs AsyncLL: destination masks and segment positions).
    Layout,
    /// `ep_dispatch_copy_to_staging`.
    CopyToStaging,
    /// `dispatch_inter_node_send` (`_ll_send`).
    DispatchSend,
    /// `dispatch_inter_node_recv` (`_ll_recv`).
    DispatchRecv,
    /// `dispatch_intra` (`dispatch_intra_node`, `_ll`; mori-rs V1/V1-LL's
    /// `dispatch_relay_forward`: a relay's records forwarded inside its node).
    DispatchIntra,
    /// `dispatch_sync`.
    DispatchSync,
    /// `dispatch_copy_out` (mori-rs AsyncLL: received records into the outputs).
    CopyOut,
    /// `combine_copy_to_staging` (mori-rs AsyncLL: rows for other nodes staged).
    CombineStaging,
    /// `combine_sync`.
    CombineSync,
    /// `ep_combine_sync_barrier`.
    CombineSyncBarrier,
    /// `combine_inter_node` (`_ll`).
    CombineInter,
    /// `combine_intra_node` (`_ll`; mori-rs V1/V1-LL's `combine_relay_reduce`: a relay's
    /// partial sums over its node's rows).
    CombineIntra,
    /// `ep_combine_all`.
    CombineAll,
}

impl Kernel {
    /// Recognizes a trace name (case-insensitive; an `ep_` prefix is optional).
    pub fn of(name: &str) -> Option<Kernel> {
        let n = name.trim().to_ascii_lowercase();
        let n = n.strip_prefix("ep_").unwrap_or(&n);
        Some(match n {
            "dispatch_layout" => Kernel::Layout,
            "dispatch_copy_to_staging" | "copy_to_staging" => Kernel::CopyToStaging,
            "dispatch_inter_node_send" | "dispatch_inter_node_ll_send" => Kernel::DispatchSend,
            "dispatch_inter_node_recv" | "dispatch_inter_node_ll_recv" => Kernel::DispatchRecv,
            "dispatch_intra" | "dispatch_intra_node" | "dispatch_intra_node_ll" | "dispatch_intra_ll" | "dispatch_relay_forward" => {
                Kernel::DispatchIntra
            }
            "dispatch_sync" => Kernel::DispatchSync,
            "dispatch_copy_out" => Kernel::CopyOut,
            "combine_copy_to_staging" => Kernel::CombineStaging,
            "combine_sync" => Kernel::CombineSync,
            "combine_sync_barrier" => Kernel::CombineSyncBarrier,
            "combine_inter_node" | "combine_inter_node_ll" => Kernel::CombineInter,
            "combine_intra_node" | "combine_intra_node_ll" | "combine_relay_reduce" => Kernel::CombineIntra,
            "combine_all" => Kernel::CombineAll,
            _ => return None,
        })
    }

    /// The lane it belongs to.
    pub fn lane(self) -> Lane {
        match self {
            Kernel::DispatchSend | Kernel::DispatchRecv | Kernel::CombineInter => Lane::Internode,
            Kernel::DispatchIntra | Kernel::CombineIntra => Lane::Intranode,
            _ => Lane::Serial,
        }
    }

    /// Phase order within an iteration (kernels of one phase run concurrently).
    pub fn phase(self) -> u8 {
        match self {
            Kernel::Layout => 0,
            Kernel::CopyToStaging => 1,
            Kernel::DispatchSend | Kernel::DispatchRecv | Kernel::DispatchIntra => 2,
            Kernel::DispatchSync => 3,
            Kernel::CopyOut => 4,
            Kernel::CombineStaging => 5,
            Kernel::CombineSync => 6,
            Kernel::CombineSyncBarrier => 7,
            Kernel::CombineInter | Kernel::CombineIntra => 8,
            Kernel::CombineAll => 9,
        }
    }

    /// Short bar label (the seed's `disp_send`, `comb_inter`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Kernel::Layout => "layout",
            Kernel::CopyToStaging => "staging",
            Kernel::DispatchSend => "disp_send",
            Kernel::DispatchRecv => "disp_recv",
            Kernel::DispatchIntra => "disp_intra",
            Kernel::DispatchSync => "disp_sync",
            Kernel::CopyOut => "copy_out",
            Kernel::CombineStaging => "comb_stage",
            Kernel::CombineSync => "comb_sync",
            Kernel::CombineSyncBarrier => "barrier",
            Kernel::CombineInter => "comb_inter",
            Kernel::CombineIntra => "comb_intra",
            Kernel::CombineAll => "comb_all",
        }
    }
}

/// Lane of any trace name ([`Lane::Other`] when not an EP kernel).
pub fn lane_of(name: &str) -> Lane {
    Kernel::of(name).map_or(Lane::Other, Kernel::lane)
}
