//! 64-bit counters in registered memory, as signalled writes update them (sans-IO part): the
//! operation a signal applies ([`SignalOp`]) and the check every counter access passes first
//! ([`check_counter`]), on the initiator against the remote descriptor and again on the target
//! against its own registration.

use crate::desc::{MemId, MemLoc};
use crate::error::{IoError, IoResult};
use serde::{Deserialize, Serialize};

/// Bytes of one counter (a little-endian `u64`, read and written as an `AtomicU64`).
pub const COUNTER_BYTES: u64 = 8;

/// What a signal does to its counter, atomically on the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SignalOp {
    /// `fetch_add(v)`, wrapping at 2^64.
    Add(u64),
    /// `store(v)`.
    Set(u64),
}

/// Checks that a counter at `offset` bytes into region `id` (`len` bytes at address `addr`,
/// located at `loc`) can be accessed as an `AtomicU64`. Errors: `NotSupported` for GPU memory
/// (counters are applied by the host engine, in host memory only); `InvalidArgs` when
/// `offset + 8` exceeds `len` (overflow included) or `addr + offset` is not 8-byte aligned,
/// naming the offset, the region and the limit.
pub fn check_counter(id: MemId, addr: u64, len: u64, loc: MemLoc, offset: u64) -> IoResult<()> {
    if let MemLoc::Gpu { device } = loc {
        return Err(IoError::not_supported(format!(
            "counter at offset {offset} of memory {id}: that region is GPU memory (device {device}); signals and counters are applied \
             by the host engine, in registered host memory only"
        )));
    }
    match offset.checked_add(COUNTER_BYTES) {
        Some(end) if end <= len => {}
        _ => {
            return Err(IoError::invalid(format!("counter at offset {offset} ({COUNTER_BYTES} bytes) exceeds memory {id} of {len} bytes")))
        }
    }
    if !addr.wrapping_add(offset).is_multiple_of(COUNTER_BYTES) {
        return Err(IoError::invalid(format!(
            "counter at offset {offset} of memory {id} lies at address {:#x}, not {COUNTER_BYTES}-byte aligned",
            addr.wrapping_add(offset)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use proptest::prelude::*;

    #[test]
    fn errors_name_offset_region_and_limit() {
        let host = MemLoc::Host { numa: None };
        let e = check_counter(3, 0x1000, 64, host, 60).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgs);
        assert!(e.msg.contains("counter at offset 60 (8 bytes) exceeds memory 3 of 64 bytes"), "{e}");
        let e = check_counter(3, 0x1000, 64, host, u64::MAX - 3).unwrap_err();
        assert!(e.msg.contains("exceeds memory 3 of 64 bytes"), "{e}");
        let e = check_counter(3, 0x1000, 64, host, 4).unwrap_err();
        assert!(e.msg.contains("lies at address 0x1004, not 8-byte aligned"), "{e}");
        let e = check_counter(4, 0x1000, 64, MemLoc::Gpu { device: 2 }, 0).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert!(e.msg.contains("memory 4: that region is GPU memory (device 2)"), "{e}");
        check_counter(3, 0x1004, 64, host, 4).unwrap();
        check_counter(3, 0x1000, 64, host, 56).unwrap();
    }

    proptest! {
        #[test]
        fn matches_a_brute_force_oracle(addr in any::<u64>(), len in 0u64..100, offset in prop_oneof![0u64..120, any::<u64>()]) {
            let ok = (offset as u128) + 8 <= len as u128 && (addr as u128 + offset as u128).is_multiple_of(8);
            prop_assert_eq!(check_counter(1, addr, len, MemLoc::Host { numa: None }, offset).is_ok(), ok);
        }
    }
}
