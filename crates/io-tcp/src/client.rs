//! Initiator side: one worker thread per data connection ("lane"), fed by a channel.

use crate::proto::*;
use crate::vio::{read_exact_vectored, write_all_vectored, NoSigPipe};
use mori_io_core::status::Completion;
use mori_io_core::wire::Role;
use mori_io_core::{BackendKind, EngineDesc, EntryMap, ErrorCode, IoError, IoResult, Op, Region, Seg, TransferStatus};
use std::io::{IoSlice, IoSliceMut, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// One request for a lane worker.
pub(crate) struct Job {
    pub op: Op,
    pub transfer_id: u64,
    pub remote_mem: u64,
    pub remote_epoch: u64,
    pub piece_total: u32,
    pub segs: Vec<Seg>,
    /// Offset of the job's first byte in the transfer's byte stream (`Piece::stream_off`).
    pub stream_off: u64,
    /// Where the transfer's batch entries lie in its byte stream.
    pub entries: Arc<EntryMap>,
    pub local: Arc<Region>,
    pub status: TransferStatus,
}

impl Job {
    /// The caller's batch entries this job carries.
    pub(crate) fn entry_range(&self) -> std::ops::Range<u32> {
        let len: u64 = self.segs.iter().map(|g| g.len).sum();
        self.entries.of_bytes(self.stream_off..self.stream_off + len)
    }

    /// The caller's batch entries of segment `k` of this job.
    fn seg_entries(&self, k: usize) -> std::ops::Range<u32> {
        let at = self.stream_off + self.segs[..k].iter().map(|g| g.len).sum::<u64>();
        self.entries.of_bytes(at..at + self.segs[k].len)
    }

    /// Records the job's end on its transfer's status.
    pub(crate) fn finish(&self, r: IoResult<()>) {
        self.status.complete_entries(Some(self.entry_range()), r);
    }
}

/// Timeouts of a lane.
#[derive(Clone, Copy)]
pub(crate) struct LaneTimeouts {
    pub connect: Duration,
    pub data: Duration,
}

/// Opens data connection `lane` to `peer` and says hello.
pub(crate) fn dial(local: &EngineDesc, peer: &EngineDesc, lane: u32, t: LaneTimeouts) -> IoResult<TcpStream> {
    mori_io_core::wire::dial(local, peer, Role::Data { backend: BackendKind::Tcp, lane }, t.connect, t.data)
}

/// Worker loop of one lane: runs jobs in order, stop-and-wait on the connection.
/// After a connection failure (or a connection the target closed while idle) the next job
/// dials again; a job that failed is not retried (its status carries the error).
pub(crate) fn run_lane(
    rx: crossbeam_channel::Receiver<Job>,
    mut conn: Option<TcpStream>,
    local: Arc<EngineDesc>,
    peer: Arc<EngineDesc>,
    lane: u32,
    t: LaneTimeouts,
) {
    while let Ok(job) = rx.recv() {
        // A cached connection the target closed meanwhile (its idle timeout, a restart) reads
        // as end-of-stream: no reply is ever pending between jobs, so readable means closed.
        if conn.as_ref().is_some_and(|s| crate::vio::wait_readable(s.as_raw_fd(), Duration::ZERO).unwrap_or(true)) {
            conn = None;
        }
        if conn.is_none() {
            match dial(&local, &peer, lane, t) {
                Ok(s) => conn = Some(s),
                Err(e) => {
                    job.finish(Err(e));
                    continue;
                }
            }
        }
        let Some(s) = conn.as_mut() else { continue };
        let r = run_job(s, &job, &Lane { peer: &peer, lane, data_timeout: t.data });
        match &r {
            Err(e) if matches!(e.code, ErrorCode::RemoteDisconnect | ErrorCode::Timeout | ErrorCode::Transport) => {
                // The stream may be out of step: drop it; the next job dials again.
                if let Some(s) = conn.take() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
            _ => {}
        }
        job.finish(r);
    }
}

/// Address of `[off, off+len)` of the local region; the engine checked the range.
fn local_ptr(region: &Region, seg_off: u64, len: u64) -> IoResult<*mut u8> {
    Ok(region.range(seg_off, len)? as *mut u8)
}

/// What a socket error names: the lane, its peer, and the deadline in force.
struct Lane<'a> {
    peer: &'a EngineDesc,
    lane: u32,
    data_timeout: Duration,
}

impl Lane<'_> {
    /// A socket error of `what` on this lane; an expired deadline says which one.
    fn io_err(&self, what: &str, e: &std::io::Error) -> IoError {
        let p = self.peer;
        let mut err = IoError::from_io(&format!("{what} on tcp lane {} to engine {:?} at {}:{}", self.lane, p.key, p.host, p.port), e);
        if err.code == ErrorCode::Timeout {
            err.msg.push_str(&format!(
                " (no progress within the data timeout of {:.3} s: TcpConfig::data_timeout, env MORI_IO_TCP_TIMEOUT_MS)",
                self.data_timeout.as_secs_f64()
            ));
        }
        err
    }
}

fn run_job(s: &mut TcpStream, job: &Job, lane: &Lane<'_>) -> IoResult<()> {
    let total: u64 = job.segs.iter().map(|g| g.len).sum();
    let head = ReqHeader {
        magic: MAGIC,
        op: if job.op == Op::Write { OP_WRITE } else { OP_READ },
        transfer_id: job.transfer_id,
        mem_id: job.remote_mem,
        total_len: total,
        nsegs: job.segs.len() as u32,
        piece_total: job.piece_total,
        epoch: job.remote_epoch,
    };
    let table: Vec<SegWire> = job.segs.iter().map(|g| SegWire { remote_off: g.remote_off, len: g.len }).collect();
    let mut ptrs = Vec::with_capacity(job.segs.len());
    for g in &job.segs {
        ptrs.push((local_ptr(&job.local, g.local_off, g.len)?, g.len as usize));
    }
    let mut out: Vec<IoSlice<'_>> = Vec::with_capacity(2 + ptrs.len());
    out.push(IoSlice::new(bytemuck::bytes_of(&head)));
    out.push(IoSlice::new(bytemuck::cast_slice(&table)));
    if job.op == Op::Write {
        // SAFETY: each (ptr, len) was bounds-checked against the local registration, which
        // `job.local` (an Arc of the region) keeps registered until this job completes.
        out.extend(ptrs.iter().map(|&(p, n)| IoSlice::new(unsafe { std::slice::from_raw_parts(p, n) })));
    }
    write_all_vectored(&mut NoSigPipe(s), &mut out).map_err(|e| lane.io_err("tcp send", &e))?;

    let mut rh = ReplyHeader { magic: 0, code: 0, transfer_id: 0, payload_len: 0, msg_len: 0, seg: NO_SEG };
    s.read_exact(bytemuck::bytes_of_mut(&mut rh)).map_err(|e| lane.io_err("tcp reply", &e))?;
    if rh.magic != MAGIC || rh.transfer_id != job.transfer_id || rh.msg_len as usize > MAX_MSG {
        return Err(IoError::transport(format!(
            "bad reply on tcp lane (magic {:#x}, transfer {} for {}, msg_len {})",
            rh.magic, rh.transfer_id, job.transfer_id, rh.msg_len
        )));
    }
    let mut msg = vec![0u8; rh.msg_len as usize];
    s.read_exact(&mut msg).map_err(|e| lane.io_err("tcp reply", &e))?;
    if rh.code != 0 {
        let text = String::from_utf8_lossy(&msg);
        let blamed = usize::try_from(rh.seg).ok().and_then(|k| job.segs.get(k).map(|g| (k, g)));
        let what = match blamed {
            Some((k, g)) => format!(
                "{} (the part of it in this request: local offset {}, remote offset {}, {} bytes)",
                EntryMap::describe(&job.seg_entries(k)),
                g.local_off,
                g.remote_off,
                g.len
            ),
            None => format!("the request of {}", EntryMap::describe(&job.entry_range())),
        };
        return Err(IoError::new(ErrorCode::from_u32(rh.code), format!("{what}: target engine refused: {text}")));
    }
    if job.op == Op::Read {
        if rh.payload_len != total {
            return Err(IoError::transport(format!("read reply carries {} bytes, expected {total}", rh.payload_len)));
        }
        // SAFETY: as above; the region stays registered while `job.local` is held.
        let mut bufs: Vec<IoSliceMut<'_>> =
            ptrs.iter().map(|&(p, n)| IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p, n) })).collect();
        read_exact_vectored(s, &mut bufs).map_err(|e| lane.io_err("tcp read payload", &e))?;
    }
    Ok(())
}
