//! A rank's window in POSIX shared memory (`shm_open` + `mmap`): created by the process that
//! hosts the rank, opened by the other processes of its node, unlinked by its creator once all
//! of them opened it (the mapping lives on until the last process unmaps it).

use crate::error::{EpError, EpResult};
use crate::internode::{SignalOp, Window};
use std::ffi::CString;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// One mapped window of `len` bytes (a multiple of 8, page-aligned start).
pub(crate) struct ShmWindow {
    ptr: *mut u8,
    len: usize,
    name: String,
    owner: bool,
}

// SAFETY: the mapping is plain shared memory; concurrent access goes through atomics (the
// counters) or through byte ranges the protocol gives to one writer at a time.
unsafe impl Send for ShmWindow {}
unsafe impl Sync for ShmWindow {}

fn os_err(what: &str, name: &str) -> EpError {
    EpError::Host { what: format!("{what} of shared-memory window {name}"), detail: std::io::Error::last_os_error().to_string() }
}

impl ShmWindow {
    /// Creates `/dev/shm{name}` of `len` bytes (zeroed) and maps it. Errors: `Host` naming the
    /// call that failed (an existing name, no space in /dev/shm).
    pub(crate) fn create(name: &str, len: usize) -> EpResult<Self> {
        Self::map(name, len, true)
    }

    /// Maps the existing window `name`; errors when it is missing or not `len` bytes.
    pub(crate) fn open(name: &str, len: usize) -> EpResult<Self> {
        Self::map(name, len, false)
    }

    fn map(name: &str, len: usize, create: bool) -> EpResult<Self> {
        let c = CString::new(name).map_err(|_| EpError::Host { what: format!("window name {name:?}"), detail: "contains NUL".into() })?;
        let flags = if create { libc::O_CREAT | libc::O_EXCL | libc::O_RDWR } else { libc::O_RDWR };
        // SAFETY: valid C string; the fd is closed below on every path.
        let fd = unsafe { libc::shm_open(c.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(os_err(if create { "shm_open (create)" } else { "shm_open" }, name));
        }
        let close = |e: EpError| {
            // SAFETY: fd is open.
            unsafe { libc::close(fd) };
            if create {
                // SAFETY: valid C string.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
            e
        };
        let off_len = libc::off_t::try_from(len).map_err(|_| EpError::SizeOverflow { what: "window bytes", limit: "off_t" })?;
        if create {
            // SAFETY: fd is an open shm object.
            if unsafe { libc::ftruncate(fd, off_len) } != 0 {
                return Err(close(os_err("ftruncate", name)));
            }
            // Reserve the pages now: a tmpfs too small for the window then fails here, with
            // its figures, instead of a SIGBUS at the first touch of a page it cannot hold.
            // SAFETY: fd is an open shm object.
            let rc = unsafe { libc::posix_fallocate(fd, 0, off_len) };
            if rc != 0 {
                let free = shm_free_bytes().map_or("unknown".to_string(), |f| format!("{f}"));
                return Err(close(EpError::Host {
                    what: format!("shared-memory window {name} ({len} bytes)"),
                    detail: format!(
                        "/dev/shm cannot hold it ({}; {free} bytes free there): lower the max tokens per rank, hidden or world size, or enlarge /dev/shm",
                        std::io::Error::from_raw_os_error(rc)
                    ),
                }));
            }
        } else {
            // SAFETY: zeroed stat is a valid out-parameter.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fd is open, st is writable.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(close(os_err("fstat", name)));
            }
            if st.st_size != off_len {
                return Err(close(EpError::Host {
                    what: format!("shared-memory window {name}"),
                    detail: format!(
                        "is {} bytes, this configuration's window is {len} bytes (a peer runs another configuration)",
                        st.st_size
                    ),
                }));
            }
        }
        // SAFETY: mapping a shm object of at least len bytes, shared, read/write.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len.max(8), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(close(os_err("mmap", name)));
        }
        // SAFETY: the mapping holds its own reference to the object.
        unsafe { libc::close(fd) };
        Ok(Self { ptr: p.cast(), len, name: name.to_string(), owner: create })
    }

    /// Removes the name (the creator does, once every process of the node mapped it).
    pub(crate) fn unlink(&mut self) {
        if self.owner {
            if let Ok(c) = CString::new(self.name.as_str()) {
                // SAFETY: valid C string.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
            self.owner = false;
        }
    }

    /// First byte of the mapping.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, r: &Range<usize>) -> EpResult<()> {
        if r.start > r.end || r.end > self.len {
            return Err(EpError::Host {
                what: format!("shared-memory window {}", self.name),
                detail: format!("bytes {}..{} lie outside its {} bytes", r.start, r.end, self.len),
            });
        }
        Ok(())
    }

    /// Copies `bytes` to byte `off`. Errors when the range leaves the window.
    pub(crate) fn write(&self, off: usize, bytes: &[u8]) -> EpResult<()> {
        let end = off.checked_add(bytes.len()).ok_or(EpError::SizeOverflow { what: "window offset", limit: "usize" })?;
        self.check(&(off..end))?;
        // SAFETY: in bounds (checked); the protocol gives this range to one writer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) };
        Ok(())
    }

    fn counter(&self, off: usize) -> Option<&AtomicU64> {
        if !off.is_multiple_of(8) || off.checked_add(8).is_none_or(|e| e > self.len) {
            return None;
        }
        // SAFETY: in bounds, 8-aligned (the mapping is page-aligned), shared memory that lives
        // as long as self.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) })
    }

    /// Applies `op` to the counter at `off` with release ordering (after this thread's data).
    pub(crate) fn signal(&self, off: usize, op: SignalOp) -> EpResult<()> {
        let c = self.counter(off).ok_or_else(|| EpError::Host {
            what: format!("shared-memory window {}", self.name),
            detail: format!("counter at byte {off} is misaligned or outside its {} bytes", self.len),
        })?;
        match op {
            SignalOp::Add(v) => {
                c.fetch_add(v, Ordering::Release);
            }
            SignalOp::Set(v) => c.store(v, Ordering::Release),
        }
        Ok(())
    }

    /// Zeroes the counters in `range` (8-byte aligned).
    pub(crate) fn zero(&self, range: Range<usize>) {
        for off in range.step_by(8) {
            if let Some(c) = self.counter(off) {
                c.store(0, Ordering::Release);
            }
        }
    }
}

impl Window for ShmWindow {
    fn load(&self, off: usize) -> u64 {
        self.counter(off).map_or(0, |c| c.load(Ordering::Acquire))
    }

    fn read(&self, off: usize, out: &mut [u8]) {
        let end = off.saturating_add(out.len()).min(self.len);
        let n = end.saturating_sub(off);
        // SAFETY: off..off+n is inside the mapping; the range is covered by a complete counter,
        // so no writer touches it now.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off.min(self.len)), out.as_mut_ptr(), n) };
        out[n..].fill(0);
    }
}

impl Drop for ShmWindow {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: mapped in map() with this length.
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(8)) };
    }
}

/// The shared-memory name of rank `r`'s window in job `job`.
pub(crate) fn window_name(job: u64, r: usize) -> String {
    format!("/mori-ep-{job:016x}-r{r}")
}

/// Removes every window of job `job` still in /dev/shm (those of processes that died between
/// creating and unlinking them); returns the names removed. For a launcher, once every process
/// of the job has exited (a live process unlinks its own windows).
pub fn remove_job_windows(job: u64) -> Vec<String> {
    let prefix = format!("mori-ep-{job:016x}-r");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return Vec::new() };
    let mut gone: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.strip_prefix(&prefix).is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())))
        .filter(|n| std::fs::remove_file(format!("/dev/shm/{n}")).is_ok())
        .collect();
    gone.sort();
    gone
}

/// Bytes free in /dev/shm (statvfs), if it can be read.
fn shm_free_bytes() -> Option<u64> {
    let c = CString::new("/dev/shm").ok()?;
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string, writable out-parameter.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::{remove_job_windows, window_name, ShmWindow};

    #[test]
    fn a_jobs_left_windows_are_removed_and_no_others() {
        let job = 0x5eed_0000_0000_0000 | u64::from(std::process::id());
        let w0 = ShmWindow::create(&window_name(job, 0), 4096).unwrap();
        let w12 = ShmWindow::create(&window_name(job, 12), 4096).unwrap();
        let other = ShmWindow::create(&window_name(job + 1, 0), 4096).unwrap();
        // As a killed process leaves them: created, never unlinked.
        std::mem::forget((w0, w12));
        assert_eq!(remove_job_windows(job), vec![format!("mori-ep-{job:016x}-r0"), format!("mori-ep-{job:016x}-r12")]);
        assert!(!std::path::Path::new(&format!("/dev/shm{}", window_name(job, 0))).exists());
        assert!(std::path::Path::new(&format!("/dev/shm{}", window_name(job + 1, 0))).exists(), "another job's window stays");
        assert!(remove_job_windows(job).is_empty());
        drop(other);
    }

    #[test]
    fn a_window_larger_than_dev_shm_is_refused_with_its_figures() {
        let c = std::ffi::CString::new("/dev/shm").unwrap();
        // SAFETY: zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string, writable out-parameter.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        // More than the whole tmpfs: tmpfs refuses such a reservation before allocating a page.
        let len = (st.f_blocks as u64 * st.f_frsize as u64 + (1 << 30)) as usize;
        let name = format!("/mori-ep-test-{}-big", std::process::id());
        let e = ShmWindow::create(&name, len).err().expect("a window larger than /dev/shm must be refused").to_string();
        assert!(e.contains(&format!("({len} bytes)")) && e.contains("/dev/shm cannot hold it") && e.contains("bytes free there"), "{e}");
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists(), "the refused window was unlinked");
        let ok = ShmWindow::create(&format!("/mori-ep-test-{}-small", std::process::id()), 1 << 20).expect("1 MiB window");
        drop(ok);
    }
}
