//! Vectored socket I/O straight into and out of registered memory.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};

/// At most this many buffers go to one `writev`/`readv` call (Linux `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes every byte of `bufs`, in order, with as few `writev` calls as the socket allows.
pub fn write_all_vectored<W: Write>(w: &mut W, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    // Empty buffers carry nothing (a socket's 0-byte write would read as "peer stopped").
    while bufs.iter().any(|b| !b.is_empty()) {
        let k = bufs.len().min(IOV_MAX);
        match w.write_vectored(&bufs[..k]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting data")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A TCP stream written with `MSG_NOSIGNAL`: a peer that went away is an `EPIPE` error, never a
/// SIGPIPE that would end the host process (`writev`, what `TcpStream::write_vectored` uses,
/// raises it wherever the host left SIGPIPE at its default, as C/C++ servers and `mori` do).
pub struct NoSigPipe<'a>(pub &'a std::net::TcpStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_with_flags(b, libc::MSG_NOSIGNAL)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Fills every byte of `bufs`, in order, with as few `readv` calls as the socket allows.
pub fn read_exact_vectored<R: Read>(r: &mut R, mut bufs: &mut [IoSliceMut<'_>]) -> io::Result<()> {
    // Nothing to read (all buffers empty) is done, not an end of stream.
    while bufs.iter().any(|b| !b.is_empty()) {
        let k = bufs.len().min(IOV_MAX);
        match r.read_vectored(&mut bufs[..k]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection mid-message")),
            Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `poll(2)` one descriptor for readability, waiting up to `t`: `Ok(false)` on timeout (or an
/// interrupted wait). Used by idle connection loops that must notice shutdown.
pub fn wait_readable(fd: std::os::fd::RawFd, t: std::time::Duration) -> io::Result<bool> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `p` is a valid pollfd for the duration of the call and nfds is 1.
    let r = unsafe { libc::poll(&mut p, 1, t.as_millis().min(i32::MAX as u128) as libc::c_int) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(r > 0)
}

/// Reads and discards exactly `n` bytes (keeps a stream in step after a refused request).
pub fn drain<R: Read>(r: &mut R, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 64 * 1024];
    while n > 0 {
        let k = (n as usize).min(scratch.len());
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer/reader that moves at most 3 bytes per call, to exercise partial progress.
    struct Trickle(Vec<u8>, usize);
    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(3);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Read for Trickle {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            let n = b.len().min(3).min(self.0.len() - self.1);
            b[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn partial_progress_keeps_order() {
        let (a, b, c) = (b"hello".to_vec(), b"".to_vec(), b"world!!".to_vec());
        let mut t = Trickle(Vec::new(), 0);
        write_all_vectored(&mut t, &mut [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)]).unwrap();
        assert_eq!(t.0, b"helloworld!!");
        let (mut x, mut y) = ([0u8; 4], [0u8; 8]);
        read_exact_vectored(&mut t, &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]).unwrap();
        assert_eq!(&x, b"hell");
        assert_eq!(&y, b"oworld!!");
        let mut z = [0u8; 1];
        let e = read_exact_vectored(&mut t, &mut [IoSliceMut::new(&mut z)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // All-empty buffer lists move nothing and succeed (a request of zero-length segments).
        let (mut e1, mut e2) = ([0u8; 0], [0u8; 0]);
        read_exact_vectored(&mut t, &mut [IoSliceMut::new(&mut e1), IoSliceMut::new(&mut e2)]).unwrap();
        write_all_vectored(&mut t, &mut [IoSlice::new(&[]), IoSlice::new(&[])]).unwrap();
    }
}
