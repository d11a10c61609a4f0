//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`, off by default; not
//! part of the crate's API otherwise).
//!
//! The wire decoders of this crate are crate-private; each function here runs one of them on
//! peer bytes exactly as the socket bootstrap does and, when the bytes decode, returns the
//! decoded value encoded again by the crate's own encoder. The formats are fixed-width little
//! endian, so a fuzz target can demand that the re-encoding equals the input byte for byte
//! (failure reports excepted: their text is decoded lossily, see [`report`]).

use std::net::SocketAddr;

use crate::error::BootstrapError;
use crate::report::Report;
use crate::wire::{decode_blocks, encode_blocks, Header, Hello, Table, HEADER_LEN};

/// Size of a frame header, bytes.
pub const FRAME_HEADER_LEN: usize = HEADER_LEN;

/// `Header::decode` (magic, tag, length limit), then `Header::encode`.
pub fn header(b: &[u8; FRAME_HEADER_LEN]) -> Result<[u8; FRAME_HEADER_LEN], BootstrapError> {
    Header::decode(b, "fuzz").map(|h| h.encode())
}

/// The payload length a decoded header announces (what the connection then reads).
pub fn header_len(b: &[u8; FRAME_HEADER_LEN]) -> Result<u64, BootstrapError> {
    Header::decode(b, "fuzz").map(|h| h.len)
}

/// A rank's hello to the root: decode, then encode.
pub fn hello(b: &[u8]) -> Result<Vec<u8>, BootstrapError> {
    Hello::decode(b, "fuzz").map(|h| h.encode())
}

/// The root's address table for a world of `world` ranks: decode, then encode; also returns
/// the addresses.
pub fn table(b: &[u8], world: usize) -> Result<(Vec<u8>, Vec<SocketAddr>), BootstrapError> {
    Table::decode(b, "fuzz", world).map(|t| (t.encode(), t.addrs))
}

/// A failure report (reject or abort): decode, then encode, and the error a rank would return
/// on receiving it, as text. The report's reason is decoded lossily (invalid UTF-8 becomes
/// U+FFFD), so the re-encoding equals the input only when the reason was valid UTF-8; it is
/// always a fixed point (decoding it again gives it back).
pub fn report(b: &[u8]) -> Result<(Vec<u8>, String), BootstrapError> {
    let root: SocketAddr = SocketAddr::from(([127, 0, 0, 1], crate::DEFAULT_PORT));
    Report::decode(b, "fuzz").map(|r| (r.encode(), r.to_error("fuzz", root).to_string()))
}

/// An all_to_all bundle that must hold `count` blocks: decode, then encode.
pub fn blocks(b: &[u8], count: usize) -> Result<Vec<u8>, BootstrapError> {
    decode_blocks(b, "fuzz", count).map(|v| encode_blocks(v.iter().map(Vec::as_slice)))
}

/// Valid encodings to seed the fuzz corpora with: a data frame header, a hello, a table of
/// `world` addresses (returned with it), one report of each kind and an all_to_all bundle of
/// `count` blocks (returned with it).
pub struct Samples {
    /// A frame header (data frame, 5-byte payload).
    pub header: [u8; FRAME_HEADER_LEN],
    /// A hello of rank 3 of 8 with an IPv4 ring listener, and one with an IPv6 listener.
    pub hellos: Vec<Vec<u8>>,
    /// An address table and its world size.
    pub table: (Vec<u8>, usize),
    /// One report of each kind.
    pub reports: Vec<Vec<u8>>,
    /// An all_to_all bundle and its block count.
    pub blocks: (Vec<u8>, usize),
}

/// See [`Samples`].
pub fn samples() -> Samples {
    let v4: SocketAddr = SocketAddr::from(([10, 1, 2, 3], 4567));
    let v6: SocketAddr = SocketAddr::from(([0xfe80, 0, 0, 0, 0, 0, 0, 1], 18515));
    let hellos = [v4, v6].map(|listen| Hello { rank: 3, world_size: 8, listen, nonce: 9, pid: 42 }.encode()).to_vec();
    let table = Table { session: 5, addrs: vec![v4, v6, v4] };
    let reports = [
        Report::Duplicate { rank: 1, first: v4, second: v6 },
        Report::WorldSize { rank: 2, expected: 3, got: 4 },
        Report::RendezvousTimeout { missing: vec![2, 5], waited: std::time::Duration::from_millis(2000) },
        Report::PeerLost { by: 4, rank: 3, reason: "connection reset".into() },
        Report::Other { by: 1, reason: "aborted".into() },
    ];
    let blocks: [&[u8]; 3] = [b"", b"abc", b"z"];
    Samples {
        header: Header { tag: crate::wire::Tag::Data, op: 3, seq: 77, len: 5 }.encode(),
        hellos,
        table: (table.encode(), table.addrs.len()),
        reports: reports.iter().map(Report::encode).collect(),
        blocks: (encode_blocks(blocks.into_iter()), blocks.len()),
    }
}
