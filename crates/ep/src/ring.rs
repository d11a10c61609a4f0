//! The proxy's command ring in shared memory: fixed-size commands written by many producers
//! (GPU warps through a device mapping of pinned host memory, or host threads) and read in
//! order by one consumer (the rank's proxy thread).
//!
//! Memory (little-endian, 64-byte aligned, zeroed before first use):
//! - the **ring region**, readable and writable by the consumer and every producer:
//!   `[0, 64)` the tail line (`tail: u64` at byte 0: tickets below it are consumed), then
//!   `slots` slots of [`SLOT_BYTES`] bytes. Slot `t % slots` carries ticket `t`:
//!   `seq: u64` at byte 0 (`t + 1` once the command is written; 0 before the first lap),
//!   `dst: u32` at 8, `op: u32` at 12 ([`OP_ADD`], [`OP_SET`] or [`OP_TAIL`]), then u64s at
//!   16 `local_off`, 24 `remote_off`, 32 `len`, 40 `counter`, 48 `value`, 56 `total` (a tail
//!   write's pair carried in the command: the second word of the 16 bytes it writes, whose
//!   first is `total - 1`; 0 when not carried).
//! - the **head** (`u64`, the next ticket), anywhere the producers can reach atomically: device
//!   memory when the producers are GPU warps (their atomics stay on the GPU), host memory for
//!   host producers. The consumer never reads it.
//!
//! Producer: `t = fetch_add(head, 1)`; wait (deadline) until `t - tail < slots`; write the
//! fields; release-store `seq = t + 1`. Consumer: while slot `tail % slots` has
//! `seq == tail + 1` (acquire), decode it and advance; release-store `tail` after each burst.
//! A slot's `seq` only grows (`t + 1`, then `t + slots + 1`, ...), so a stale lap never reads
//! as ready. `kernels/ep_proxy.cu` (`mori_ring_push`) is the GPU producer; its byte offsets
//! are these.

use crate::error::{EpError, EpResult};
use crate::internode::SignalOp;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Bytes of one slot.
pub const SLOT_BYTES: usize = 64;
/// Bytes of a command in its slot (after `seq`).
pub const CMD_BYTES: usize = SLOT_BYTES - 8;
/// Bytes before the first slot (the tail's cache line).
pub const TAIL_BYTES: usize = 64;
/// Most slots of a ring.
pub const MAX_SLOTS: usize = 1 << 20;
/// `op` of an addition to the counter.
pub const OP_ADD: u32 = 1;
/// `op` of a store to the counter.
pub const OP_SET: u32 = 2;
/// `op` of a tail write: after the bytes landed, the 16 bytes at `value` of the producer's
/// window go to byte `counter` of the destination's window (no control message).
pub const OP_TAIL: u32 = 3;

/// What follows a command's bytes at the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdOp {
    /// `fetch_add` on the u64 at `counter` of the destination's counter region (a MORI-IO
    /// signal, applied by the destination's engine).
    Add(u64),
    /// Store to that u64 (a MORI-IO signal).
    Set(u64),
    /// A write of the 16 bytes at `src` of the producer's window to byte `counter` of the
    /// destination's window, posted once the command's bytes landed: a completion pair
    /// (`arrived`, `total`) the receiver polls in its own memory.
    Tail {
        /// Byte offset of the 16 bytes in the producer's window.
        src: u64,
        /// The pair's second word when the producer carries it in the command (the 16 bytes
        /// at `src` are then `(total - 1, total)`, little-endian u64s): a transport may store
        /// the two words itself instead of copying them ([`mori_io::TailWord`]). `None` when
        /// not carried (slot bytes 56..64 zero).
        total: Option<u64>,
    },
}

impl From<SignalOp> for CmdOp {
    fn from(s: SignalOp) -> Self {
        match s {
            SignalOp::Add(v) => CmdOp::Add(v),
            SignalOp::Set(v) => CmdOp::Set(v),
        }
    }
}

/// Bytes of a [`CmdOp::Tail`] write.
pub const TAIL_WRITE_BYTES: u64 = 16;

/// The size of a ring: a power of two between 2 and [`MAX_SLOTS`] slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    slots: usize,
}

impl RingLayout {
    /// A ring of `slots` slots. Errors: `InvalidConfig` naming `ring slots` unless it is a
    /// power of two in `2..=MAX_SLOTS`.
    pub fn new(slots: usize) -> EpResult<Self> {
        if !slots.is_power_of_two() || !(2..=MAX_SLOTS).contains(&slots) {
            return Err(EpError::InvalidConfig {
                field: "ring slots",
                value: slots.to_string(),
                reason: format!("must be a power of two in 2..={MAX_SLOTS}"),
            });
        }
        Ok(Self { slots })
    }

    /// Slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of the ring region (tail line and slots).
    pub fn bytes(&self) -> usize {
        TAIL_BYTES + self.slots * SLOT_BYTES
    }

    /// Byte offset of the slot carrying ticket `t`.
    pub fn slot_offset(&self, t: u64) -> usize {
        TAIL_BYTES + (t as usize & (self.slots - 1)) * SLOT_BYTES
    }
}

/// One command: `len` bytes at `local_off` of the producer's window to `remote_off` of rank
/// `dst`'s window, then `op` at byte `counter` (of `dst`'s counter region for a signal, of its
/// window for a tail write). `len = 0`: the operation alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingCmd {
    /// Destination rank.
    pub dst: u32,
    /// Source byte offset in the producer's window.
    pub local_off: u64,
    /// Destination byte offset in `dst`'s window.
    pub remote_off: u64,
    /// Bytes to write.
    pub len: u64,
    /// Byte offset of the counter (8-aligned).
    pub counter: u64,
    /// What follows the bytes once they are visible at `dst`.
    pub op: CmdOp,
}

impl RingCmd {
    /// The slot bytes after `seq` (bytes 8..64 of a slot).
    pub fn encode(&self) -> [u8; CMD_BYTES] {
        let (code, value, total) = match self.op {
            CmdOp::Add(v) => (OP_ADD, v, 0),
            CmdOp::Set(v) => (OP_SET, v, 0),
            CmdOp::Tail { src, total } => (OP_TAIL, src, total.unwrap_or(0)),
        };
        let mut b = [0u8; CMD_BYTES];
        b[0..4].copy_from_slice(&self.dst.to_le_bytes());
        b[4..8].copy_from_slice(&code.to_le_bytes());
        for (i, v) in [self.local_off, self.remote_off, self.len, self.counter, value, total].into_iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Decodes bytes 8..64 of a slot. Errors: [`RingError::BadOp`] naming the ticket.
    pub fn decode(b: &[u8; CMD_BYTES], ticket: u64) -> Result<Self, RingError> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(v)
        };
        let op = match u32_at(4) {
            OP_ADD => CmdOp::Add(u64_at(40)),
            OP_SET => CmdOp::Set(u64_at(40)),
            OP_TAIL => CmdOp::Tail { src: u64_at(40), total: Some(u64_at(48)).filter(|&t| t != 0) },
            code => return Err(RingError::BadOp { ticket, code }),
        };
        Ok(Self { dst: u32_at(0), local_off: u64_at(8), remote_off: u64_at(16), len: u64_at(24), counter: u64_at(32), op })
    }
}

/// A ring region in memory shared with its producers.
#[derive(Debug, Clone, Copy)]
pub struct RingMem {
    base: *mut u8,
    layout: RingLayout,
}

// SAFETY: the region is only accessed through atomics (seq, tail) and through reads/writes of
// slot bytes that the seq protocol hands to one side at a time; the pointer stays valid for as
// long as the creator of the RingMem promised (see `RingMem::new`).
unsafe impl Send for RingMem {}
// SAFETY: as for Send.
unsafe impl Sync for RingMem {}

impl RingMem {
    /// The ring at `base`.
    ///
    /// # Safety
    /// `base` is 64-byte aligned, valid for reads and writes of `layout.bytes()` bytes for as
    /// long as any copy of the returned value is used, zeroed before the first producer or
    /// consumer touches it, and accessed by nothing but ring producers and one consumer.
    pub unsafe fn new(base: *mut u8, layout: RingLayout) -> EpResult<Self> {
        if base.is_null() || !(base as usize).is_multiple_of(64) {
            return Err(EpError::InvalidConfig {
                field: "ring base address",
                value: format!("{base:p}"),
                reason: "must be non-null and 64-byte aligned".into(),
            });
        }
        Ok(Self { base, layout })
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The region's address.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is 8-aligned inside the region (tail at 0, seq at each slot's start),
        // which `new`'s contract keeps valid and aligned; shared words are only ever accessed
        // atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(off) as *mut u64) }
    }

    fn tail(&self) -> &AtomicU64 {
        self.word(0)
    }
}

/// Ring failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The consumer did not free a slot before the deadline.
    #[error("the proxy's command ring stayed full ({slots} slots, ticket {ticket}, consumer at {tail}) until the deadline")]
    Full {
        /// Slots of the ring.
        slots: usize,
        /// The ticket that waited.
        ticket: u64,
        /// The consumer's tail at the deadline.
        tail: u64,
    },
    /// A command whose op code is none of [`OP_ADD`], [`OP_SET`], [`OP_TAIL`] (a producer
    /// wrote garbage).
    #[error("proxy command {ticket} has op code {code} (known: 1 add, 2 set, 3 tail write)")]
    BadOp {
        /// Its ticket.
        ticket: u64,
        /// The code found.
        code: u32,
    },
}

/// A host producer (GPU producers use `mori_ring_push` in kernels/ep_proxy.cu).
pub struct RingProducer<'a> {
    mem: RingMem,
    head: &'a AtomicU64,
}

impl<'a> RingProducer<'a> {
    /// A producer of `mem` reserving tickets from `head` (shared by every producer).
    pub fn new(mem: RingMem, head: &'a AtomicU64) -> Self {
        Self { mem, head }
    }

    /// Writes `cmd` into the next slot, waiting until `deadline` for room.
    /// Errors: [`RingError::Full`]; the ticket then stays reserved and the ring is unusable
    /// (the consumer waits for it forever): a producer that gives up must fail the job.
    pub fn push(&self, cmd: &RingCmd, deadline: Instant) -> Result<u64, RingError> {
        let lay = self.mem.layout;
        let t = self.head.fetch_add(1, Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            let tail = self.mem.tail().load(Ordering::Acquire);
            if t.wrapping_sub(tail) < lay.slots as u64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(RingError::Full { slots: lay.slots, ticket: t, tail });
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let off = lay.slot_offset(t);
        let bytes = cmd.encode();
        // SAFETY: slot bytes 8..64 of ticket t's slot are inside the region; the seq protocol
        // gives them to this producer alone (the consumer passed ticket t - slots, and no other
        // producer holds ticket t).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.base.add(off + 8), bytes.len()) };
        self.mem.word(off).store(t + 1, Ordering::Release);
        Ok(t)
    }
}

/// The single consumer of a ring.
pub struct RingConsumer {
    mem: RingMem,
    tail: u64,
}

impl RingConsumer {
    /// The consumer of `mem`, starting at ticket 0.
    pub fn new(mem: RingMem) -> Self {
        Self { mem, tail: 0 }
    }

    /// Tickets consumed so far.
    pub fn consumed(&self) -> u64 {
        self.tail
    }

    /// Appends up to `max` ready commands, in ticket order, to `out`, frees their slots, and
    /// returns how many. Errors: [`RingError::BadOp`] for a command with an unknown op code (its
    /// slot is freed, the others of the burst are returned).
    pub fn poll(&mut self, out: &mut Vec<RingCmd>, max: usize) -> Result<usize, RingError> {
        let lay = self.mem.layout;
        let mut n = 0;
        let mut first_err = None;
        while n < max {
            let off = lay.slot_offset(self.tail);
            if self.mem.word(off).load(Ordering::Acquire) != self.tail + 1 {
                break;
            }
            let mut b = [0u8; CMD_BYTES];
            // SAFETY: the slot is inside the region and, its seq being tail + 1, written and
            // released by its producer; no producer writes it again before tail passes it.
            unsafe { std::ptr::copy_nonoverlapping(self.mem.base.add(off + 8), b.as_mut_ptr(), b.len()) };
            match RingCmd::decode(&b, self.tail) {
                Ok(c) => out.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            self.tail += 1;
            n += 1;
        }
        if n > 0 {
            self.mem.tail().store(self.tail, Ordering::Release);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_limits() {
        assert!(RingLayout::new(0).is_err());
        assert!(RingLayout::new(3).is_err());
        assert!(RingLayout::new(MAX_SLOTS * 2).is_err());
        let l = RingLayout::new(8).unwrap();
        assert_eq!(l.bytes(), 64 + 8 * 64);
        assert_eq!(l.slot_offset(9), 64 + 64);
    }

    #[test]
    fn encode_decode() {
        let c = RingCmd { dst: 7, local_off: 1 << 40, remote_off: 3, len: 5, counter: 16, op: CmdOp::Set(9) };
        assert_eq!(RingCmd::decode(&c.encode(), 0).unwrap(), c);
        let t = RingCmd { op: CmdOp::Tail { src: 1 << 33, total: None }, ..c };
        assert_eq!(RingCmd::decode(&t.encode(), 0).unwrap(), t);
        assert_eq!(t.encode()[4], OP_TAIL as u8);
        assert_eq!(&t.encode()[48..56], &[0u8; 8], "no pair carried: slot bytes 56..64 zero");
        let p = RingCmd { op: CmdOp::Tail { src: 64, total: Some(0x0102_0304_0506_0708) }, ..c };
        assert_eq!(RingCmd::decode(&p.encode(), 0).unwrap(), p);
        assert_eq!(&p.encode()[48..56], &0x0102_0304_0506_0708u64.to_le_bytes(), "the pair's total at slot byte 56");
        assert_eq!(c.encode()[48..56], [0u8; 8], "a signal carries nothing there");
        let mut b = c.encode();
        b[4] = 4;
        let e = RingCmd::decode(&b, 12).unwrap_err().to_string();
        assert_eq!(e, "proxy command 12 has op code 4 (known: 1 add, 2 set, 3 tail write)");
    }
}
