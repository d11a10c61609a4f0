//! Descriptors exchanged between engines out of band: [`EngineDesc`] and [`MemoryDesc`].
//!
//! Both serialize with postcard behind one version byte ([`DESC_VERSION`]); decoding rejects
//! an unknown version, truncated input and trailing bytes with `InvalidArgs`.
//!
//! Incarnations: every engine draws a random [`EngineDesc::epoch`] when it starts, and every
//! [`MemoryDesc`] carries the epoch of the engine that registered it
//! ([`MemoryDesc::engine_epoch`]). An engine restarted under the same key has another epoch,
//! so a descriptor of its previous life is told apart from one of the new (region ids restart
//! at 1 with each engine) and refused as stale instead of landing in another region.
//!
//! Capabilities: every engine also draws a random 128-bit [`EngineDesc::secret`] that travels
//! only inside its packed descriptor (through the caller's own channel), never on the wire.
//! Every connection to the engine (control and data) must prove it holds it, and the engine
//! proves it holds it to the dialer first ([`crate::handshake`]); a connection that cannot is
//! refused before any memory is touched. `MORI_IO_AUTH=off` turns the check off (benchmarks):
//! the engine then advertises [`Secret::NONE`] and accepts any hello.

use crate::error::{IoError, IoResult};
use serde::{Deserialize, Serialize};

/// Version byte that prefixes every serialized descriptor.
pub const DESC_VERSION: u8 = 3;

/// An engine's capability secret (128 random bits from `getrandom(2)`). Its `Debug` form
/// never shows the value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub u128);

impl Secret {
    /// The secret of an engine that checks none (`MORI_IO_AUTH=off`).
    pub const NONE: Secret = Secret(0);

    /// 128 fresh random bits. Errors: `Transport` when the kernel's random source fails.
    pub fn random() -> IoResult<Secret> {
        let mut b = [0u8; 16];
        let mut got = 0usize;
        while got < b.len() {
            // SAFETY: the pointer and length describe the unfilled tail of `b`.
            let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(IoError::transport(format!("getrandom for the engine secret: {e}")));
            }
            got += r as usize;
        }
        Ok(Secret(u128::from_le_bytes(b).max(1)))
    }

    /// Compares without an early exit (the time taken does not tell how many leading bits of
    /// a guess were right).
    pub fn matches(&self, other: &Secret) -> bool {
        ct_eq(&self.0.to_le_bytes(), &other.0.to_le_bytes())
    }
}

/// Whether `a == b`, comparing every byte (no early exit on the first difference).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if *self == Secret::NONE { "Secret(none)" } else { "Secret(..)" })
    }
}

/// Identifies an engine and tells peers how to reach its control plane.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EngineDesc {
    /// Unique engine key chosen by the user (e.g. "prefill-0").
    pub key: String,
    /// Identifies the node (host) the engine runs on; engines with equal `node_id` share a node.
    pub node_id: String,
    /// The host name of that node.
    pub hostname: String,
    /// Address the control-plane listener is reachable at (IPv4/IPv6 literal or host name).
    pub host: String,
    /// Port of the control-plane listener.
    pub port: u16,
    /// Process id of the owning process.
    pub pid: u32,
    /// Random, non-zero, drawn once per engine ([`new_epoch`]): tells this engine from any
    /// other that had or will have the same key (a restart), see the module doc.
    pub epoch: u64,
    /// The capability every connection to this engine must prove it holds ([`Secret::NONE`] when
    /// the engine checks none); see the module doc. Give the packed descriptor only to
    /// engines that may read and write this engine's registered memory.
    pub secret: Secret,
}

/// A fresh random engine epoch, never 0 ([`mori_bootstrap::random_u64`]).
pub fn new_epoch() -> u64 {
    mori_bootstrap::random_u64().max(1)
}

/// Where a registered region lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemLoc {
    /// Host (CPU) memory, optionally on a known NUMA node.
    Host {
        /// NUMA node, if known.
        numa: Option<u32>,
    },
    /// GPU device memory on the given device ordinal.
    Gpu {
        /// Device ordinal as the GPU runtime numbers it.
        device: u32,
    },
}

impl MemLoc {
    /// True for host memory.
    pub fn is_host(&self) -> bool {
        matches!(self, MemLoc::Host { .. })
    }

    /// The device ordinal of GPU memory; `None` for host memory.
    pub fn gpu(&self) -> Option<u32> {
        match *self {
            MemLoc::Gpu { device } => Some(device),
            MemLoc::Host { .. } => None,
        }
    }
}

/// Identifier of a registered region, unique within its engine.
pub type MemId = u64;

/// A registered memory region as peers see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryDesc {
    /// Key of the engine that registered it.
    pub engine_key: String,
    /// [`EngineDesc::epoch`] of that engine: a peer restarted under the same key has another,
    /// and transfers naming this descriptor are then refused as stale (`RemoteDisconnect`).
    pub engine_epoch: u64,
    /// Region id within that engine.
    pub id: MemId,
    /// Virtual address of the region's first byte in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Host or GPU.
    pub loc: MemLoc,
    /// PCI bus id of the GPU (or NIC-local device) when known.
    pub bus_id: Option<String>,
    /// Backend-specific handles (IPC handle, fabric handle, rkeys) as the backends fill them.
    pub handles: Vec<BackendHandle>,
}

/// An opaque handle a backend attached to a [`MemoryDesc`] at registration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BackendHandle {
    /// Which backend understands it.
    pub backend: crate::BackendKind,
    /// The backend's serialized handle.
    pub bytes: Vec<u8>,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![DESC_VERSION];
    // postcard serialization of these plain structs cannot fail (no maps with non-string keys,
    // no unsupported types); fall back to an empty body that decode rejects, never panic.
    match postcard::to_allocvec(v) {
        Ok(body) => out.extend_from_slice(&body),
        Err(_) => out.clear(),
    }
    out
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> IoResult<T> {
    let (&ver, body) = bytes.split_first().ok_or_else(|| IoError::invalid(format!("{what}: empty input (expected version byte)")))?;
    if ver != DESC_VERSION {
        return Err(IoError::invalid(format!("{what}: unknown descriptor version {ver} (this build reads version {DESC_VERSION})")));
    }
    let (v, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| IoError::invalid(format!("{what}: malformed or truncated ({e}), {} bytes", bytes.len())))?;
    if !rest.is_empty() {
        return Err(IoError::invalid(format!("{what}: {} trailing bytes after the descriptor", rest.len())));
    }
    Ok(v)
}

impl EngineDesc {
    /// Serializes as `[DESC_VERSION] ++ postcard(self)`.
    pub fn pack(&self) -> Vec<u8> {
        encode(self)
    }
    /// Parses what [`EngineDesc::pack`] produced. Errors: `InvalidArgs` for an unknown version,
    /// truncated or trailing bytes.
    pub fn unpack(bytes: &[u8]) -> IoResult<Self> {
        decode("EngineDesc", bytes)
    }
}

impl MemoryDesc {
    /// Serializes as `[DESC_VERSION] ++ postcard(self)`.
    pub fn pack(&self) -> Vec<u8> {
        encode(self)
    }
    /// Parses what [`MemoryDesc::pack`] produced. Errors as [`EngineDesc::unpack`].
    pub fn unpack(bytes: &[u8]) -> IoResult<Self> {
        decode("MemoryDesc", bytes)
    }
    /// The handle a given backend attached, if any.
    pub fn handle(&self, backend: crate::BackendKind) -> Option<&[u8]> {
        self.handles.iter().find(|h| h.backend == backend).map(|h| h.bytes.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn engine() -> EngineDesc {
        EngineDesc {
            key: "prefill-0".into(),
            node_id: "n1".into(),
            hostname: "h".into(),
            host: "127.0.0.1".into(),
            port: 18516,
            pid: 42,
            epoch: 7,
            secret: Secret(0x1234_5678_9abc_def0_0fed_cba9_8765_4321),
        }
    }

    #[test]
    fn secrets_are_random_compare_whole_and_never_print() {
        let (a, b) = (Secret::random().unwrap(), Secret::random().unwrap());
        assert_ne!(a, b);
        assert_ne!(a, Secret::NONE);
        assert!(a.matches(&a) && !a.matches(&b) && !a.matches(&Secret(a.0 ^ (1 << 127))));
        let shown = format!("{:?}", engine());
        assert!(shown.contains("Secret(..)") && !shown.contains("1234") && !shown.contains(&format!("{}", engine().secret.0)), "{shown}");
        assert_eq!(format!("{:?}", Secret::NONE), "Secret(none)");
    }

    #[test]
    fn round_trip_and_rejections() {
        let e = engine();
        let b = e.pack();
        assert_eq!(b[0], DESC_VERSION);
        assert_eq!(EngineDesc::unpack(&b).unwrap(), e);
        let mut bad = b.clone();
        bad[0] = 9;
        let err = EngineDesc::unpack(&bad).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::InvalidArgs);
        assert!(err.msg.contains("unknown descriptor version 9"), "{err}");
        assert!(EngineDesc::unpack(&[]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(EngineDesc::unpack(&long).unwrap_err().msg.contains("trailing"));
    }

    #[test]
    fn epochs_are_non_zero_and_differ() {
        let v: Vec<u64> = (0..64).map(|_| new_epoch()).collect();
        assert!(v.iter().all(|&e| e != 0));
        let set: std::collections::HashSet<u64> = v.iter().copied().collect();
        assert_eq!(set.len(), v.len(), "64 epochs of one process are distinct");
    }

    proptest! {
        #[test]
        fn memory_desc_round_trips_and_every_truncation_fails(
            id in any::<u64>(), addr in any::<u64>(), len in any::<u64>(), gpu in any::<bool>(),
            dev in 0u32..16, h in proptest::collection::vec(any::<u8>(), 0..64)
        ) {
            let d = MemoryDesc {
                engine_key: "decode-3".into(), engine_epoch: addr ^ 5, id, addr, len,
                loc: if gpu { MemLoc::Gpu { device: dev } } else { MemLoc::Host { numa: Some(dev) } },
                bus_id: gpu.then(|| "0000:19:00.0".to_string()),
                handles: vec![BackendHandle { backend: crate::BackendKind::Tcp, bytes: h }],
            };
            let b = d.pack();
            prop_assert_eq!(MemoryDesc::unpack(&b).unwrap(), d);
            for cut in 0..b.len() {
                prop_assert!(MemoryDesc::unpack(&b[..cut]).is_err());
            }
        }
    }
}
