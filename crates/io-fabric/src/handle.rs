//! What the fabric backend puts in a [`mori_io_core::MemoryDesc`] ([`FabricHandle`]) and what
//! an owner grants an importer ([`Grant`]). Both encode as a version byte plus postcard;
//! decoding refuses another version, truncation and trailing bytes.

use crate::domain::{FabricDomain, HandleType};
use mori_io_core::{IoError, IoResult};
use serde::{Deserialize, Serialize};

/// Version byte of [`FabricHandle`] and [`Grant`] encodings.
pub const HANDLE_VERSION: u8 = 1;

/// Longest abstract socket name accepted (Linux allows 107 bytes after the leading NUL).
pub const MAX_SOCKET_NAME: usize = 100;

/// The fabric handle of a registered region, as peers see it in its `MemoryDesc`.
///
/// The descriptor's fields are claims: bounds come from the owner's [`Grant`], never from here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricHandle {
    /// The owner's domain (checked against the importer's before any import).
    pub domain: FabricDomain,
    /// Abstract Unix socket name where the owner hands out POSIX FDs (POSIX-FD domains only).
    pub socket: Option<String>,
}

impl FabricHandle {
    /// Handle type (from the domain).
    pub fn handle_type(&self) -> HandleType {
        self.domain.handle_type()
    }

    /// `[HANDLE_VERSION] ++ postcard(self)`.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes [`FabricHandle::to_bytes`]. Errors: `InvalidArgs` for another version,
    /// malformed, truncated or trailing bytes, a POSIX-FD handle without a socket name or one
    /// longer than [`MAX_SOCKET_NAME`].
    pub fn from_bytes(b: &[u8]) -> IoResult<Self> {
        let h: FabricHandle = decode("fabric handle", b)?;
        match (&h.domain, &h.socket) {
            (FabricDomain::Node { .. }, None) => Err(IoError::invalid("fabric handle: POSIX-FD handle without a socket name")),
            (_, Some(s)) if s.is_empty() || s.len() > MAX_SOCKET_NAME => {
                Err(IoError::invalid(format!("fabric handle: socket name of {} bytes (1..={MAX_SOCKET_NAME})", s.len())))
            }
            _ => Ok(h),
        }
    }
}

/// What an owner confirms to an importer for one region: where the region starts inside the
/// exported allocation, its registered length, and the allocation's shareable-handle
/// descriptor (`mori_gpu::ShareableHandle::descriptor`; a POSIX FD travels beside it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Offset of the region's first byte inside the allocation.
    pub offset: u64,
    /// Registered length, bytes.
    pub len: u64,
    /// The 80-byte shareable-handle descriptor.
    pub descriptor: Vec<u8>,
}

impl Grant {
    /// `[HANDLE_VERSION] ++ postcard(self)`.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes [`Grant::to_bytes`]. Errors: `InvalidArgs` as [`FabricHandle::from_bytes`], or
    /// for a descriptor of the wrong size or `offset + len` overflowing.
    pub fn from_bytes(b: &[u8]) -> IoResult<Self> {
        let g: Grant = decode("fabric grant", b)?;
        if g.descriptor.len() != mori_gpu::ShareableHandle::DESCRIPTOR_LEN {
            return Err(IoError::invalid(format!(
                "fabric grant: handle descriptor of {} bytes, expected {}",
                g.descriptor.len(),
                mori_gpu::ShareableHandle::DESCRIPTOR_LEN
            )));
        }
        if g.offset.checked_add(g.len).is_none() {
            return Err(IoError::invalid(format!("fabric grant: offset {} + len {} overflows", g.offset, g.len)));
        }
        Ok(g)
    }

    /// Checks the granted range lies inside an allocation of `size` bytes.
    /// Errors: `InvalidArgs` naming the range and the size.
    pub fn check_inside(&self, size: u64) -> IoResult<()> {
        match self.offset.checked_add(self.len) {
            Some(end) if end <= size && self.len > 0 => Ok(()),
            _ => Err(IoError::invalid(format!(
                "fabric grant: region {}+{} is not inside its allocation of {size} bytes",
                self.offset, self.len
            ))),
        }
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![HANDLE_VERSION];
    match postcard::to_allocvec(v) {
        Ok(body) => out.extend_from_slice(&body),
        Err(_) => out.clear(), // plain structs cannot fail; an empty encoding is refused on decode
    }
    out
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, b: &[u8]) -> IoResult<T> {
    let (&v, body) = b.split_first().ok_or_else(|| IoError::invalid(format!("{what}: empty")))?;
    if v != HANDLE_VERSION {
        return Err(IoError::invalid(format!("{what}: version {v} (this build reads {HANDLE_VERSION})")));
    }
    let (x, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| IoError::invalid(format!("{what}: malformed ({e}), {} bytes", b.len())))?;
    if !rest.is_empty() {
        return Err(IoError::invalid(format!("{what}: {} trailing bytes", rest.len())));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node() -> FabricDomain {
        FabricDomain::Node { boot_id: "b".into(), netns: "net:[4026531840]".into(), hostname: "h".into() }
    }

    #[test]
    fn handle_round_trip_and_refusals() {
        let h = FabricHandle { domain: node(), socket: Some("mori-fabric.1.k.0".into()) };
        let b = h.to_bytes();
        assert_eq!(b[0], HANDLE_VERSION);
        assert_eq!(FabricHandle::from_bytes(&b).unwrap(), h);
        assert_eq!(h.handle_type(), HandleType::PosixFd);
        let mut v2 = b.clone();
        v2[0] = 2;
        assert!(FabricHandle::from_bytes(&v2).unwrap_err().msg.contains("version 2 (this build reads 1)"));
        let mut long = b.clone();
        long.push(0);
        assert!(FabricHandle::from_bytes(&long).unwrap_err().msg.contains("1 trailing bytes"));
        let no_sock = FabricHandle { domain: node(), socket: None }.to_bytes();
        assert!(FabricHandle::from_bytes(&no_sock).unwrap_err().msg.contains("without a socket name"));
        let big = FabricHandle { domain: node(), socket: Some("x".repeat(101)) }.to_bytes();
        assert!(FabricHandle::from_bytes(&big).unwrap_err().msg.contains("101 bytes"));
        let fab = FabricHandle { domain: FabricDomain::Fabric { cluster: "c".into(), clique: 1 }, socket: None };
        assert_eq!(FabricHandle::from_bytes(&fab.to_bytes()).unwrap().handle_type(), HandleType::Fabric);
    }

    #[test]
    fn grant_checks() {
        let g = Grant { offset: 4096, len: 100, descriptor: vec![0; 80] };
        assert_eq!(Grant::from_bytes(&g.to_bytes()).unwrap(), g);
        assert!(g.check_inside(4196).is_ok());
        assert!(g.check_inside(4195).unwrap_err().msg.contains("4096+100 is not inside its allocation of 4195 bytes"));
        let short = Grant { descriptor: vec![0; 79], ..g.clone() };
        assert!(Grant::from_bytes(&short.to_bytes()).unwrap_err().msg.contains("79 bytes, expected 80"));
        let wrap = Grant { offset: u64::MAX, len: 2, ..g.clone() };
        assert!(Grant::from_bytes(&wrap.to_bytes()).unwrap_err().msg.contains("overflows"));
        let empty = Grant { len: 0, ..g };
        assert!(empty.check_inside(1 << 20).is_err());
    }

    proptest! {
        #[test]
        fn every_truncation_of_a_grant_fails(off in any::<u32>(), len in 1u64..1 << 40, d in proptest::collection::vec(any::<u8>(), 80)) {
            let g = Grant { offset: off as u64, len, descriptor: d };
            let b = g.to_bytes();
            prop_assert_eq!(Grant::from_bytes(&b).unwrap(), g);
            for cut in 0..b.len() {
                prop_assert!(Grant::from_bytes(&b[..cut]).is_err());
            }
        }
    }
}
