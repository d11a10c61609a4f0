//! The value types of the command line's flags (element types, kernel type, device, transport,
//! fault injection point), with what each maps to in MORI-EP.

use clap::ValueEnum;
use mori_ep::KernelType;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum DType {
    Bf16,
    F32,
    /// FP8 E4M3 rows with f32 scales per 128 columns.
    Fp8,
}

impl DType {
    /// The flag value, as the user types it.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::Fp8 => "fp8",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::F32 => 4,
            DType::Fp8 => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum CombDType {
    Bf16,
    F32,
}

impl CombDType {
    pub fn size(self) -> usize {
        match self {
            CombDType::Bf16 => 2,
            CombDType::F32 => 4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdxType {
    I32,
    I64,
}

impl IdxType {
    pub fn size(self) -> usize {
        match self {
            IdxType::I32 => 4,
            IdxType::I64 => 8,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelTypeArg {
    /// All ranks on one node (P2P); the default for one node.
    Intranode,
    /// Inter-node V1 (RDMA and XGMI blocks); the default for several nodes.
    V1,
    /// Inter-node V1, low latency.
    #[value(name = "v1_ll")]
    V1Ll,
    /// Asynchronous low-latency kernels.
    #[value(name = "async_ll")]
    AsyncLl,
}

impl KernelTypeArg {
    pub fn of(k: KernelType) -> Self {
        match k {
            KernelType::IntraNode => KernelTypeArg::Intranode,
            KernelType::InterNodeV1 => KernelTypeArg::V1,
            KernelType::InterNodeV1LL => KernelTypeArg::V1Ll,
            KernelType::AsyncLL => KernelTypeArg::AsyncLl,
        }
    }

    pub fn kernel_type(self) -> KernelType {
        match self {
            KernelTypeArg::Intranode => KernelType::IntraNode,
            KernelTypeArg::V1 => KernelType::InterNodeV1,
            KernelTypeArg::V1Ll => KernelType::InterNodeV1LL,
            KernelTypeArg::AsyncLl => KernelType::AsyncLL,
        }
    }

    /// The flag value, as the user types it.
    pub fn name(self) -> &'static str {
        match self {
            KernelTypeArg::Intranode => "intranode",
            KernelTypeArg::V1 => "v1",
            KernelTypeArg::V1Ll => "v1_ll",
            KernelTypeArg::AsyncLl => "async_ll",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The GPU kernels (intranode; v1, v1_ll and async_ll across nodes with every rank on one
    /// GPU), timed with GPU events.
    Gpu,
    /// The host implementation (mori_ep::host): shared memory within a node, MORI-IO between
    /// nodes.
    Cpu,
}

/// Where `--inject-kill-rank` strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KillAt {
    /// SIGKILL before joining the bootstrap.
    Bootstrap,
    /// SIGKILL during setup, after creating its windows and before unlinking them.
    Setup,
    /// SIGKILL inside the second dispatch, before its first rank issues its puts.
    Dispatch,
    /// SIGSTOP at the same point (a hung process).
    StopInDispatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum TransportArg {
    /// MORI-IO over TCP.
    Tcp,
    /// MORI-IO over RDMA verbs.
    Rdma,
}
