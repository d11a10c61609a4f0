//! `fabric_handle`: what the fabric backend decodes from peers: the [`FabricHandle`] in a
//! remote `MemoryDesc` and the owner's [`Grant`] (over the control plane or the Unix socket),
//! then the domain rule applied to the handle's domain ([`mori_io_fabric::domain::check`]).
//!
//! Input: `[kind] bytes...`: kind 0 a handle, 1 a grant. Asserted for what decodes: it
//! encodes back to itself in no more bytes than the input; a POSIX-FD handle names a socket
//! of 1..=[`MAX_SOCKET_NAME`] bytes; a grant carries an 80-byte descriptor and an
//! `offset + len` that does not overflow, and [`Grant::check_inside`] accepts exactly the
//! allocations that hold its non-empty range; a handle's domain is importable into itself and
//! the domain check answers for every pair without panicking.

use mori_io_fabric::domain::check;
use mori_io_fabric::handle::MAX_SOCKET_NAME;
use mori_io_fabric::{FabricDomain, FabricHandle, Grant};

fn domains() -> [FabricDomain; 2] {
    [
        FabricDomain::Node { boot_id: "b".into(), netns: "net:[4026531840]".into(), hostname: "h".into() },
        FabricDomain::Fabric { cluster: "5c1e2b3a-0000-4000-8000-000000000001".into(), clique: 7 },
    ]
}

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let kind = c.u8() % 2;
    let b = c.rest();
    if kind == 0 {
        let Ok(h) = FabricHandle::from_bytes(b) else { return };
        let enc = h.to_bytes();
        assert!(enc.len() <= b.len(), "canonical handle of {} bytes from {}", enc.len(), b.len());
        assert_eq!(FabricHandle::from_bytes(&enc).as_ref().ok(), Some(&h), "handle round trip");
        if let FabricDomain::Node { .. } = h.domain {
            let n = h.socket.as_ref().map_or(0, String::len);
            assert!((1..=MAX_SOCKET_NAME).contains(&n), "POSIX-FD handle with a socket name of {n} bytes");
        }
        assert_eq!(check(&h.domain, &h.domain), Ok(()), "{} is not importable into itself", h.domain);
        for d in domains() {
            let _ = check(&d, &h.domain);
            let _ = check(&h.domain, &d);
        }
        let _ = h.domain.to_string();
    } else {
        let Ok(g) = Grant::from_bytes(b) else { return };
        let enc = g.to_bytes();
        assert!(enc.len() <= b.len(), "canonical grant of {} bytes from {}", enc.len(), b.len());
        assert_eq!(Grant::from_bytes(&enc).as_ref().ok(), Some(&g), "grant round trip");
        assert_eq!(g.descriptor.len(), mori_gpu::ShareableHandle::DESCRIPTOR_LEN);
        let end = g.offset.checked_add(g.len).expect("the grant's range does not overflow");
        for size in [0, end.saturating_sub(1), end, end.saturating_add(1), u64::MAX] {
            let inside = g.len > 0 && end <= size;
            assert_eq!(g.check_inside(size).is_ok(), inside, "check_inside({size}) of {}+{}", g.offset, g.len);
        }
    }
}

/// Handles of both domain kinds and grants.
pub fn seeds() -> Vec<Vec<u8>> {
    let [node, fabric] = domains();
    let desc = mori_gpu::ShareableHandle::from_fabric(mori_gpu::RuntimeKind::Cuda, [3; mori_gpu::RAW_HANDLE_LEN], 2 << 20).descriptor();
    vec![
        crate::tagged(0, &FabricHandle { domain: node, socket: Some("mori-fabric-4242-1".into()) }.to_bytes()),
        crate::tagged(0, &FabricHandle { domain: fabric, socket: None }.to_bytes()),
        crate::tagged(1, &Grant { offset: 4096, len: 1 << 20, descriptor: desc.to_vec() }.to_bytes()),
        crate::tagged(1, &Grant { offset: 0, len: 0, descriptor: desc.to_vec() }.to_bytes()),
    ]
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
