//! Passing a file descriptor (a POSIX FD shareable handle, a dmabuf) to another process over a
//! Unix stream socket with `SCM_RIGHTS`, together with a fixed-size message.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};

use crate::error::{GpuError, Result};

fn nix_io(op: &'static str, e: Errno) -> GpuError {
    GpuError::io(op, std::io::Error::from(e))
}

/// Sends `payload` (non-empty) with `fd` attached to its first byte.
pub fn send_with_fd(sock: &UnixStream, payload: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<()> {
    if payload.is_empty() {
        return Err(GpuError::invalid("an fd needs at least one payload byte to travel with"));
    }
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() { Vec::new() } else { vec![ControlMessage::ScmRights(&fds)] };
    let sent = loop {
        match sendmsg::<UnixAddr>(sock.as_raw_fd(), &[IoSlice::new(payload)], &cmsgs, MsgFlags::empty(), None) {
            Ok(n) => break n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(nix_io("sendmsg with SCM_RIGHTS", e)),
        }
    };
    if sent < payload.len() {
        let mut s = sock;
        s.write_all(&payload[sent..]).map_err(|e| GpuError::io("sending the rest of an fd message", e))?;
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes (non-empty) and the fd attached to them, if any.
/// Received descriptors are close-on-exec.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> Result<Option<OwnedFd>> {
    if buf.is_empty() {
        return Err(GpuError::invalid("receive buffer is empty"));
    }
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let (got, mut fds) = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds: Vec<OwnedFd> = Vec::new();
                let cmsgs = msg.cmsgs().map_err(|e| nix_io("SCM_RIGHTS control data truncated", e))?;
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for r in raw {
                            // SAFETY: the kernel installed `r` in this process for this message;
                            // nothing else owns it.
                            fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                        }
                    }
                }
                break (msg.bytes, fds);
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(nix_io("recvmsg with SCM_RIGHTS", e)),
        }
    };
    if got == 0 {
        return Err(GpuError::io(
            "receiving an fd message",
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed the socket"),
        ));
    }
    if fds.len() > 1 {
        return Err(GpuError::invalid(format!("expected at most one file descriptor, received {}", fds.len())));
    }
    if got < buf.len() {
        let mut s = sock;
        s.read_exact(&mut buf[got..]).map_err(|e| GpuError::io("receiving the rest of an fd message", e))?;
    }
    Ok(fds.pop())
}
