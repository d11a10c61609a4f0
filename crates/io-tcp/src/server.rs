//! Target side of a TCP data connection: validates each request against the registry, then
//! moves the payload straight between the socket and registered memory.

use crate::proto::*;
use crate::vio::{drain, read_exact_vectored, wait_readable, write_all_vectored, NoSigPipe};
use bytemuck::Zeroable;
use mori_io_core::{BackendContext, ErrorCode, InboundSlot, IoError, Region};
use std::io::{IoSlice, IoSliceMut, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often an idle connection checks for shutdown.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// Serves one inbound data connection until the peer closes it, a protocol error occurs,
/// `shutdown` is set (checked before every request, and every [`IDLE_POLL`] while idle), or
/// it stayed idle for the slot's idle timeout. `from` is the initiator's engine key; `slot`
/// (the engine's inbound cap) is held until the connection ends.
pub(crate) fn serve(mut s: TcpStream, ctx: BackendContext, from: String, shutdown: Arc<AtomicBool>, slot: InboundSlot) {
    let mut link = ctx.links.opened(&from);
    let mut idle_since = std::time::Instant::now();
    loop {
        match wait_readable(s.as_raw_fd(), IDLE_POLL) {
            Ok(false) => {
                if shutdown.load(Ordering::Acquire) {
                    return;
                }
                if idle_since.elapsed() >= slot.idle_timeout() {
                    tracing::debug!(peer = %from, idle_s = slot.idle_timeout().as_secs_f64(), "idle tcp data connection closed");
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    return;
                }
                continue;
            }
            // A backend that was dropped (its engine too) serves nothing more: the memory it
            // would write into may be freed by now. The initiator sees the connection close.
            Ok(true) if shutdown.load(Ordering::Acquire) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
                return;
            }
            Ok(true) => {}
            // A poll error is this side's (not evidence of the peer's close).
            Err(_) => return,
        }
        if let Err(e) = serve_one(&mut s, &ctx, &from) {
            if e.code == ErrorCode::RemoteDisconnect {
                link.closed_by_peer();
            } else {
                tracing::warn!(peer = %from, error = %e, "tcp data connection closed");
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
            return;
        }
        idle_since = std::time::Instant::now();
    }
}

fn read_pod<T: bytemuck::Pod>(s: &mut TcpStream) -> Result<T, IoError> {
    let mut v = T::zeroed();
    s.read_exact(bytemuck::bytes_of_mut(&mut v)).map_err(|e| IoError::from_io("tcp request", &e))?;
    Ok(v)
}

/// A refusal, and the segment it blames ([`NO_SEG`] for none).
type Refused = (IoError, u32);

fn reply(s: &mut TcpStream, id: u64, r: &Result<(), Refused>, payload: &mut [IoSlice<'_>], payload_len: u64) -> Result<(), IoError> {
    let msg = match r {
        Ok(()) => String::new(),
        Err((e, _)) => {
            let mut cut = e.msg.len().min(MAX_MSG);
            while !e.msg.is_char_boundary(cut) {
                cut -= 1;
            }
            e.msg[..cut].to_string()
        }
    };
    let h = ReplyHeader {
        magic: MAGIC,
        code: r.as_ref().map(|_| 0).unwrap_or_else(|(e, _)| e.code.as_u32()),
        transfer_id: id,
        payload_len,
        msg_len: msg.len() as u32,
        seg: r.as_ref().map(|_| NO_SEG).unwrap_or_else(|(_, k)| *k),
    };
    let mut v = Vec::with_capacity(2 + payload.len());
    v.push(IoSlice::new(bytemuck::bytes_of(&h)));
    v.push(IoSlice::new(msg.as_bytes()));
    v.extend(payload.iter().map(|p| IoSlice::new(p)));
    write_all_vectored(&mut NoSigPipe(s), &mut v).map_err(|e| IoError::from_io("tcp reply", &e))
}

/// Validates the segments against the target region and returns it; a refusal names the
/// segment at fault when there is one (its index travels in the reply header, and the
/// initiator names the caller's batch entry).
fn resolve(ctx: &BackendContext, h: &ReqHeader, segs: &[SegWire]) -> Result<Arc<Region>, Refused> {
    let whole = |e: IoError| (e, NO_SEG);
    if h.epoch != ctx.local.epoch {
        return Err(whole(IoError::disconnected(format!(
            "stale descriptor: memory {} names engine {:?} epoch {:#x}, this engine of that key has epoch {:#x} (the engine the \
             descriptor came from is gone); nothing was moved",
            h.mem_id, ctx.local.key, h.epoch, ctx.local.epoch
        ))));
    }
    let region = ctx.registry.get(h.mem_id).map_err(whole)?;
    let mut sum: u64 = 0;
    for (i, sg) in segs.iter().enumerate() {
        region.range(sg.remote_off, sg.len).map_err(|e| (IoError::invalid(e.msg), i as u32))?;
        sum = sum.checked_add(sg.len).ok_or_else(|| whole(IoError::invalid("segment lengths overflow")))?;
    }
    if sum != h.total_len {
        return Err(whole(IoError::invalid(format!("segments sum to {sum} bytes but the header says {}", h.total_len))));
    }
    Ok(region)
}

fn serve_one(s: &mut TcpStream, ctx: &BackendContext, from: &str) -> Result<(), IoError> {
    let h: ReqHeader = read_pod(s)?;
    if h.magic != MAGIC || (h.op != OP_WRITE && h.op != OP_READ) {
        return Err(IoError::transport(format!("bad request header from {from} (magic {:#x}, op {})", h.magic, h.op)));
    }
    if h.nsegs as usize > MAX_SEGS_PER_REQ {
        let e = IoError::invalid(format!("request carries {} segments, above the limit of {MAX_SEGS_PER_REQ}", h.nsegs));
        let _ = reply(s, h.transfer_id, &Err((e.clone(), NO_SEG)), &mut [], 0);
        return Err(e);
    }
    let mut segs = vec![SegWire::zeroed(); h.nsegs as usize];
    s.read_exact(bytemuck::cast_slice_mut(&mut segs)).map_err(|e| IoError::from_io("tcp request", &e))?;
    let checked = resolve(ctx, &h, &segs);
    if h.op == OP_WRITE {
        let r = match &checked {
            Ok(region) => {
                let mut bufs: Vec<IoSliceMut<'_>> = segs
                    .iter()
                    .map(|sg| {
                        let p = region.addr + sg.remote_off as usize;
                        // SAFETY: `resolve` checked [remote_off, remote_off+len) lies inside the
                        // registered region, and the `Arc<Region>` held here keeps the
                        // registration (whose owner promised the memory stays valid while
                        // registered) from completing deregistration until we are done.
                        IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, sg.len as usize) })
                    })
                    .collect();
                read_exact_vectored(s, &mut bufs).map_err(|e| IoError::from_io("tcp write payload", &e))?;
                Ok(())
            }
            Err(_) => {
                drain(s, h.total_len).map_err(|e| IoError::from_io("tcp write payload (refused)", &e))?;
                checked.as_ref().map(|_| ()).map_err(Clone::clone)
            }
        };
        // The data is in place (or refused): record, then acknowledge.
        ctx.inbound.piece_done(from, h.transfer_id, h.piece_total, r.clone().map_err(|(e, _)| e));
        reply(s, h.transfer_id, &r, &mut [], 0)
    } else {
        match checked {
            Ok(region) => {
                let mut bufs: Vec<IoSlice<'_>> = segs
                    .iter()
                    .map(|sg| {
                        let p = region.addr + sg.remote_off as usize;
                        // SAFETY: as for writes: bounds checked by `resolve`, registration held.
                        IoSlice::new(unsafe { std::slice::from_raw_parts(p as *const u8, sg.len as usize) })
                    })
                    .collect();
                reply(s, h.transfer_id, &Ok(()), &mut bufs, h.total_len)?;
                ctx.inbound.piece_done(from, h.transfer_id, h.piece_total, Ok(()));
                Ok(())
            }
            Err(refused) => {
                ctx.inbound.piece_done(from, h.transfer_id, h.piece_total, Err(refused.0.clone()));
                reply(s, h.transfer_id, &Err(refused), &mut [], 0)
            }
        }
    }
}
