//! `gpu_handle`: the fixed encodings of GPU handles that arrive from peers:
//! [`IpcHandle::from_bytes`] (the xgmi handle in a `MemoryDesc`, and the PE records of the
//! symmetric heap) and [`ShareableHandle::from_descriptor`] (the 80-byte descriptor in a
//! fabric grant; for a POSIX-FD handle the descriptor travels with a received file descriptor).
//!
//! Input: `[kind] bytes...`: kind 0 an IPC handle, 1 a descriptor without a file descriptor,
//! 2 a descriptor with one (`/dev/null` opened stands in for the received one). Asserted for
//! what decodes: encoding it again reproduces every byte of the input except the reserved
//! ones (IPC handle bytes 6-7 and 12-15; descriptor byte 7; the FABRIC bytes 16-79 of a
//! POSIX-FD descriptor, which are zero), the decoded range `offset + len` does not overflow,
//! a descriptor's size is not zero, and a POSIX-FD handle holds the file descriptor given.

use mori_gpu::{IpcHandle, RuntimeKind, ShareableHandle, ShareableKind};
use std::os::fd::AsRawFd;

fn same_except(what: &str, got: &[u8], input: &[u8], reserved: impl Fn(usize) -> bool) {
    assert_eq!(got.len(), input.len(), "{what}: encoding of {} bytes from {}", got.len(), input.len());
    for (i, (g, b)) in got.iter().zip(input).enumerate() {
        if !reserved(i) {
            assert_eq!(g, b, "{what}: byte {i} re-encodes as {g:#04x}, input {b:#04x}");
        }
    }
}

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let kind = c.u8() % 3;
    let b = c.rest();
    match kind {
        0 => {
            if let Ok(h) = IpcHandle::from_bytes(b) {
                assert!(h.offset().checked_add(h.len()).is_some(), "{h:?}: offset + len overflows");
                let enc = h.to_bytes();
                same_except("IPC handle", &enc, b, |i| matches!(i, 6 | 7 | 12..=15));
                assert_eq!(IpcHandle::from_bytes(&enc).as_ref().ok(), Some(&h), "IPC handle round trip");
            }
        }
        _ => {
            let fd = if kind == 2 { std::fs::File::open("/dev/null").ok().map(std::os::fd::OwnedFd::from) } else { None };
            let raw = fd.as_ref().map(|f| f.as_raw_fd());
            if let Ok(h) = ShareableHandle::from_descriptor(b, fd) {
                assert!(h.size() > 0, "{h:?}: size 0 accepted");
                let enc = h.descriptor();
                match h.kind() {
                    ShareableKind::Fabric => {
                        same_except("descriptor", &enc, b, |i| i == 7);
                        assert_eq!(h.fabric().map(|r| &r[..]), Some(&b[16..80]), "FABRIC bytes");
                    }
                    ShareableKind::PosixFd => {
                        same_except("descriptor", &enc, b, |i| i == 7 || i >= 16);
                        assert!(enc[16..].iter().all(|&x| x == 0), "a POSIX-FD descriptor carries FABRIC bytes");
                        assert_eq!(h.posix_fd().map(|f| f.as_raw_fd()), raw, "the handle holds another file descriptor");
                    }
                }
                let back = ShareableHandle::from_descriptor(&enc, h.posix_fd().and_then(|f| f.try_clone_to_owned().ok()))
                    .expect("a re-encoded descriptor decodes");
                assert_eq!((back.kind(), back.runtime(), back.size()), (h.kind(), h.runtime(), h.size()), "descriptor round trip");
            }
        }
    }
}

/// IPC handles of both runtimes, FABRIC and POSIX-FD descriptors.
pub fn seeds() -> Vec<Vec<u8>> {
    let raw: [u8; mori_gpu::RAW_HANDLE_LEN] = std::array::from_fn(|i| i as u8);
    let mut v = Vec::new();
    for rt in [RuntimeKind::Cuda, RuntimeKind::Hip] {
        v.push(crate::tagged(0, &IpcHandle::new(rt, raw, 4096, 1 << 20, 4242).to_bytes()));
        v.push(crate::tagged(1, &ShareableHandle::from_fabric(rt, raw, 2 << 20).descriptor()));
    }
    let mut fd = ShareableHandle::from_fabric(RuntimeKind::Cuda, [0; mori_gpu::RAW_HANDLE_LEN], 2 << 20).descriptor();
    fd[6] = 1; // POSIX-FD kind
    v.push(crate::tagged(2, &fd));
    v
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
