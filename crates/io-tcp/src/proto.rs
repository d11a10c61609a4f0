//! Wire format of the TCP data connections (fixed little-endian headers, `bytemuck` POD).
//!
//! Request: [`ReqHeader`], then `nsegs` × [`SegWire`] (remote offset, length), then for a write
//! `total_len` payload bytes in segment order. Reply: [`ReplyHeader`], then `msg_len` bytes of
//! UTF-8 error text, then for a successful read `payload_len` bytes in segment order.

use bytemuck::{Pod, Zeroable};

/// "MRIT" (MORI TCP), first field of every header.
pub const MAGIC: u32 = 0x5449_524d;
/// `ReqHeader::op` for a write (initiator -> target).
pub const OP_WRITE: u32 = 1;
/// `ReqHeader::op` for a read (target -> initiator).
pub const OP_READ: u32 = 2;
/// Most segments one request may carry; longer batches travel as several requests.
pub const MAX_SEGS_PER_REQ: usize = 8192;
/// Longest error text a reply carries, bytes.
pub const MAX_MSG: usize = 4096;

/// Request header, 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Eq)]
pub struct ReqHeader {
    /// [`MAGIC`].
    pub magic: u32,
    /// [`OP_WRITE`] or [`OP_READ`].
    pub op: u32,
    /// Transfer id chosen by the initiator.
    pub transfer_id: u64,
    /// Target region id.
    pub mem_id: u64,
    /// Sum of the segment lengths, bytes.
    pub total_len: u64,
    /// Number of [`SegWire`] entries that follow.
    pub nsegs: u32,
    /// Number of requests (over all lanes) the transfer was cut into.
    pub piece_total: u32,
    /// The target engine's epoch as the initiator's descriptor of the region says
    /// (`MemoryDesc::engine_epoch`); the target refuses a request naming another incarnation.
    pub epoch: u64,
}

/// One remote segment, 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Eq)]
pub struct SegWire {
    /// Offset in the target region, bytes.
    pub remote_off: u64,
    /// Length, bytes.
    pub len: u64,
}

/// Reply header, 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, PartialEq, Eq)]
pub struct ReplyHeader {
    /// [`MAGIC`].
    pub magic: u32,
    /// `ErrorCode::as_u32` (0 = success).
    pub code: u32,
    /// Echo of the request's transfer id.
    pub transfer_id: u64,
    /// Payload bytes following (reads only).
    pub payload_len: u64,
    /// Error text bytes following the header.
    pub msg_len: u32,
    /// For a refusal caused by one segment: its index in the request's segment table;
    /// [`NO_SEG`] otherwise.
    pub seg: u32,
}

/// [`ReplyHeader::seg`] of a reply that blames no single segment.
pub const NO_SEG: u32 = u32::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_sizes_are_fixed() {
        assert_eq!(std::mem::size_of::<ReqHeader>(), 48);
        assert_eq!(std::mem::size_of::<SegWire>(), 16);
        assert_eq!(std::mem::size_of::<ReplyHeader>(), 32);
        let h = ReqHeader { magic: MAGIC, op: OP_READ, transfer_id: 9, mem_id: 3, total_len: 77, nsegs: 2, piece_total: 1, epoch: 5 };
        let b = bytemuck::bytes_of(&h);
        assert_eq!(&b[..4], b"MRIT");
        assert_eq!(bytemuck::pod_read_unaligned::<ReqHeader>(b), h);
    }
}
