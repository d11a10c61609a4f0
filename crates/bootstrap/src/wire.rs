//! Wire format (sans-IO): frame header and the rendezvous / abort messages.
//!
//! Every frame is `magic u16 | tag u8 | op u8 | seq u64 | len u64` (little endian, 20 bytes)
//! followed by `len` payload bytes, `len <= MAX_FRAME_LEN`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::BootstrapError;

/// Identifies our frames ("MB" for MORI bootstrap).
pub(crate) const MAGIC: u16 = 0x424d;
/// Size of the frame header in bytes.
pub(crate) const HEADER_LEN: usize = 20;
/// Version carried in the hello; a mismatch is a protocol error.
pub(crate) const VERSION: u16 = 1;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    Data = 1,
    Abort = 2,
    Hello = 3,
    Table = 4,
    Reject = 5,
    RingHello = 6,
}

impl Tag {
    fn from_u8(v: u8) -> Option<Tag> {
        Some(match v {
            1 => Tag::Data,
            2 => Tag::Abort,
            3 => Tag::Hello,
            4 => Tag::Table,
            5 => Tag::Reject,
            6 => Tag::RingHello,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub tag: Tag,
    pub op: u8,
    pub seq: u64,
    pub len: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = self.tag as u8;
        b[3] = self.op;
        b[4..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses and checks a header; `from` names the sender in errors.
    pub fn decode(b: &[u8; HEADER_LEN], from: &str) -> Result<Header, BootstrapError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(proto(from, format!("bad frame magic {magic:#06x} (not a MORI bootstrap peer?)")));
        }
        let tag = Tag::from_u8(b[2]).ok_or_else(|| proto(from, format!("unknown frame tag {}", b[2])))?;
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[4..12]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&b[12..20]);
        let len = u64::from_le_bytes(len);
        if len > crate::MAX_FRAME_LEN {
            return Err(BootstrapError::FrameTooLarge { from: from.to_string(), len, max: crate::MAX_FRAME_LEN });
        }
        Ok(Header { tag, op: b[3], seq: u64::from_le_bytes(seq), len })
    }
}

pub(crate) fn proto(from: &str, detail: impl Into<String>) -> BootstrapError {
    BootstrapError::Protocol { from: from.to_string(), detail: detail.into() }
}

/// Little-endian encoder.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// `usize` as u64 (lossless on every supported target).
    pub fn uz(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.uz(v.len());
        self.0.extend_from_slice(v);
        self
    }
    pub fn addr(&mut self, a: &SocketAddr) -> &mut Self {
        match a.ip() {
            IpAddr::V4(ip) => self.u8(4).0.extend_from_slice(&ip.octets()),
            IpAddr::V6(ip) => self.u8(6).0.extend_from_slice(&ip.octets()),
        }
        self.u16(a.port())
    }
}

/// Bounds-checked little-endian decoder; every failure is a [`BootstrapError::Protocol`].
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    from: &'a str,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8], from: &'a str) -> Self {
        Dec { buf, from }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], BootstrapError> {
        if self.buf.len() < n {
            return Err(proto(self.from, format!("message truncated: wanted {n} more bytes, {} left", self.buf.len())));
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], BootstrapError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, BootstrapError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, BootstrapError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub fn u32(&mut self) -> Result<u32, BootstrapError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub fn u64(&mut self) -> Result<u64, BootstrapError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub fn uz(&mut self) -> Result<usize, BootstrapError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| proto(self.from, format!("value {v} does not fit in usize")))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], BootstrapError> {
        let n = self.uz()?;
        self.take(n)
    }
    pub fn addr(&mut self) -> Result<SocketAddr, BootstrapError> {
        let ip = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(self.arr::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.arr::<16>()?)),
            f => return Err(proto(self.from, format!("unknown address family {f}"))),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
    pub fn end(&self) -> Result<(), BootstrapError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(proto(self.from, format!("{} unexpected trailing bytes", self.buf.len())))
        }
    }
}

/// First message of a non-root rank to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub rank: usize,
    pub world_size: usize,
    /// The rank's ring listener.
    pub listen: SocketAddr,
    /// Random per process instance: tells a reconnect of the same process from a duplicate.
    pub nonce: u64,
    pub pid: u32,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u16(VERSION).uz(self.rank).uz(self.world_size).addr(&self.listen).u64(self.nonce).u32(self.pid);
        e.0
    }
    pub fn decode(b: &[u8], from: &str) -> Result<Hello, BootstrapError> {
        let mut d = Dec::new(b, from);
        let v = d.u16()?;
        if v != VERSION {
            return Err(proto(from, format!("bootstrap protocol version {v}, this build speaks {VERSION}")));
        }
        let h = Hello { rank: d.uz()?, world_size: d.uz()?, listen: d.addr()?, nonce: d.u64()?, pid: d.u32()? };
        d.end()?;
        Ok(h)
    }
}

/// Root -> every rank once all arrived: the session id and every rank's ring listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Table {
    pub session: u64,
    pub addrs: Vec<SocketAddr>,
}

impl Table {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.session).uz(self.addrs.len());
        for a in &self.addrs {
            e.addr(a);
        }
        e.0
    }
    pub fn decode(b: &[u8], from: &str, world: usize) -> Result<Table, BootstrapError> {
        let mut d = Dec::new(b, from);
        let session = d.u64()?;
        let n = d.uz()?;
        if n != world {
            return Err(proto(from, format!("address table has {n} entries, world size is {world}")));
        }
        let addrs = (0..n).map(|_| d.addr()).collect::<Result<Vec<_>, _>>()?;
        d.end()?;
        Ok(Table { session, addrs })
    }
}

/// Encodes all_to_all blocks as one bundle: `count u64 | (len u64 | bytes)*`.
pub(crate) fn encode_blocks<'b>(blocks: impl ExactSizeIterator<Item = &'b [u8]>) -> Vec<u8> {
    let mut e = Enc::default();
    e.uz(blocks.len());
    for b in blocks {
        e.bytes(b);
    }
    e.0
}

/// Size in bytes of `encode_blocks` over blocks of these lengths.
pub(crate) fn blocks_len(lens: impl Iterator<Item = usize>) -> u64 {
    lens.fold(8u64, |acc, l| acc.saturating_add(8).saturating_add(l as u64))
}

/// Decodes a bundle that must hold exactly `count` blocks.
pub(crate) fn decode_blocks(b: &[u8], from: &str, count: usize) -> Result<Vec<Vec<u8>>, BootstrapError> {
    let mut d = Dec::new(b, from);
    let n = d.uz()?;
    if n != count {
        return Err(proto(from, format!("all_to_all bundle holds {n} blocks, expected {count}")));
    }
    let v = (0..n).map(|_| d.bytes().map(<[u8]>::to_vec)).collect::<Result<Vec<_>, _>>()?;
    d.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_limits() {
        let h = Header { tag: Tag::Data, op: 3, seq: 77, len: 5 };
        assert_eq!(Header::decode(&h.encode(), "x").unwrap(), h);
        let big = Header { len: crate::MAX_FRAME_LEN + 1, ..h }.encode();
        match Header::decode(&big, "rank 3") {
            Err(BootstrapError::FrameTooLarge { from, len, .. }) => {
                assert_eq!(from, "rank 3");
                assert_eq!(len, crate::MAX_FRAME_LEN + 1);
            }
            other => panic!("{other:?}"),
        }
        let mut bad = h.encode();
        bad[0] = b'G';
        assert!(matches!(Header::decode(&bad, "x"), Err(BootstrapError::Protocol { .. })));
    }

    #[test]
    fn messages_roundtrip() {
        let hello = Hello { rank: 3, world_size: 8, listen: "10.1.2.3:4567".parse().unwrap(), nonce: 9, pid: 42 };
        assert_eq!(Hello::decode(&hello.encode(), "x").unwrap(), hello);
        let t = Table { session: 5, addrs: vec!["127.0.0.1:1".parse().unwrap(), "[::1]:2".parse().unwrap()] };
        assert_eq!(Table::decode(&t.encode(), "x", 2).unwrap(), t);
        assert!(Table::decode(&t.encode(), "x", 3).is_err());
        let blocks: Vec<&[u8]> = vec![b"", b"abc", b"z"];
        let enc = encode_blocks(blocks.iter().copied());
        assert_eq!(enc.len() as u64, blocks_len(blocks.iter().map(|b| b.len())));
        assert_eq!(decode_blocks(&enc, "x", 3).unwrap(), vec![b"".to_vec(), b"abc".to_vec(), b"z".to_vec()]);
        assert!(decode_blocks(&enc[..enc.len() - 1], "x", 3).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..40 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let _ = Hello::decode(&junk, "x");
            let _ = Table::decode(&junk, "x", 2);
            let _ = crate::report::Report::decode(&junk, "x");
            let _ = decode_blocks(&junk, "x", 1);
        }
    }
}
