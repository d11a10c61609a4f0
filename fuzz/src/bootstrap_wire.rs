//! `bootstrap_wire`: the socket bootstrap's decoders of peer bytes (crates/bootstrap/src/wire.rs
//! and report.rs, reached through `mori_bootstrap::fuzzing`): frame header, a rank's hello,
//! the root's address table, failure reports, all_to_all bundles.
//!
//! Input: `[kind] [n] bytes...`; `kind` picks the decoder, `n` the world size or block count
//! the table or bundle must have. The formats are fixed-width little endian, so what decodes
//! must encode back to the input byte for byte; a report (whose reason text is decoded
//! lossily) must encode to a fixed point, equal to the input when the reason was UTF-8. A
//! header must announce at most `MAX_FRAME_LEN` bytes; a table must hold `n` addresses.

use mori_bootstrap::fuzzing::{self, FRAME_HEADER_LEN};

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let (kind, n) = (c.u8(), usize::from(c.u8()));
    let b = c.rest();
    match kind % 5 {
        0 => {
            let Ok(h) = <[u8; FRAME_HEADER_LEN]>::try_from(b) else { return };
            if let Ok(enc) = fuzzing::header(&h) {
                assert_eq!(enc, h, "header re-encodes differently");
                let len = fuzzing::header_len(&h).expect("decoded once");
                assert!(len <= mori_bootstrap::MAX_FRAME_LEN, "header accepted {len} bytes");
            }
        }
        1 => {
            if let Ok(enc) = fuzzing::hello(b) {
                assert_eq!(enc, b, "hello re-encodes differently");
            }
        }
        2 => {
            if let Ok((enc, addrs)) = fuzzing::table(b, n) {
                assert_eq!(enc, b, "table re-encodes differently");
                assert_eq!(addrs.len(), n, "table of {} addresses for a world of {n}", addrs.len());
            }
        }
        3 => {
            if let Ok((enc, err)) = fuzzing::report(b) {
                assert!(!err.is_empty());
                let again = fuzzing::report(&enc).expect("a re-encoded report decodes");
                assert_eq!(again.0, enc, "report re-encoding is not a fixed point");
                assert_eq!(again.1, err, "the same report gives another error");
                if enc != b {
                    assert!(reason_not_utf8(b), "a report with a UTF-8 reason re-encodes differently");
                }
            }
        }
        _ => {
            if let Ok(enc) = fuzzing::blocks(b, n) {
                assert_eq!(enc, b, "bundle re-encodes differently");
            }
        }
    }
}

/// Whether the reason text of report bytes `b` (length-prefixed, after the fixed fields of
/// kinds 4 and 5) is not UTF-8: only then may the re-encoding differ from the input.
fn reason_not_utf8(b: &[u8]) -> bool {
    let skip = match b.first() {
        Some(4) => 1 + 8 + 8,
        Some(5) => 1 + 8,
        _ => return false,
    };
    let Some(len) = b.get(skip..skip + 8) else { return false };
    let len = u64::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
    b.get(skip + 8..).and_then(|t| t.get(..len)).is_some_and(|t| std::str::from_utf8(t).is_err())
}

/// Every message kind, valid.
pub fn seeds() -> Vec<Vec<u8>> {
    let s = fuzzing::samples();
    let mut v = vec![[&[0u8, 0][..], &s.header].concat()];
    v.extend(s.hellos.iter().map(|h| [&[1u8, 0][..], h].concat()));
    v.push([&[2u8, s.table.1 as u8][..], &s.table.0].concat());
    v.extend(s.reports.iter().map(|r| [&[3u8, 0][..], r].concat()));
    v.push([&[4u8, s.blocks.1 as u8][..], &s.blocks.0].concat());
    v
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
