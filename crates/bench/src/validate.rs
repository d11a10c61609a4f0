//! Validation data: a rank-, point- and offset-dependent pattern and one checksum per slot
//! (the seed: "seeds a rank- and offset-dependent pattern and exchanges one checksum per
//! transferred slot").

use xxhash_rust::xxh3::xxh3_64;

/// Fills `buf[off..off+len]` for every slot with the pattern of (`rank`, `point`): each 8-byte
/// word depends on its absolute offset, so a slot landing at the wrong place fails too.
pub fn fill(buf: &mut [u8], offs: &[u64], len: u64, rank: u64, point: u64) {
    let word = |w: u64| w.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (rank + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (point + 1) << 40;
    for &o in offs {
        let (start, end) = (o, o + len);
        let mut pos = start;
        // Bytes up to the first 8-aligned offset, then whole words, then the tail.
        while pos < end && pos % 8 != 0 {
            buf[pos as usize] = (word(pos / 8) >> ((pos % 8) * 8)) as u8;
            pos += 1;
        }
        while pos + 8 <= end {
            buf[pos as usize..pos as usize + 8].copy_from_slice(&word(pos / 8).to_le_bytes());
            pos += 8;
        }
        while pos < end {
            buf[pos as usize] = (word(pos / 8) >> ((pos % 8) * 8)) as u8;
            pos += 1;
        }
    }
}

/// xxh3-64 of every slot.
pub fn checksums(buf: &[u8], offs: &[u64], len: u64) -> Vec<u64> {
    offs.iter().map(|&o| xxh3_64(&buf[o as usize..(o + len) as usize])).collect()
}

/// Index of the first slot whose checksums differ (`None` when all match; a length mismatch
/// reports the first missing index).
pub fn first_mismatch(a: &[u64], b: &[u64]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_fill_equals_bytewise_definition() {
        let mut a = vec![0u8; 200];
        fill(&mut a, &[3, 50, 130], 37, 1, 9);
        for &o in &[3u64, 50, 130] {
            for pos in o..o + 37 {
                let w = (pos / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 2u64.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ 10 << 40;
                assert_eq!(a[pos as usize], (w >> ((pos % 8) * 8)) as u8, "offset {pos}");
            }
        }
        assert_eq!(a[0], 0, "outside the slots untouched");
    }

    #[test]
    fn pattern_depends_on_rank_point_and_offset() {
        let mut a = vec![0u8; 256];
        let mut b = vec![0u8; 256];
        fill(&mut a, &[0, 128], 64, 0, 0);
        fill(&mut b, &[0, 128], 64, 0, 0);
        assert_eq!(checksums(&a, &[0, 128], 64), checksums(&b, &[0, 128], 64));
        fill(&mut b, &[0, 128], 64, 0, 1);
        assert_eq!(first_mismatch(&checksums(&a, &[0, 128], 64), &checksums(&b, &[0, 128], 64)), Some(0));
        fill(&mut b, &[0, 128], 64, 1, 0);
        assert!(first_mismatch(&checksums(&a, &[0, 128], 64), &checksums(&b, &[0, 128], 64)).is_some());
        // The two slots differ from each other (offset-dependent).
        let c = checksums(&a, &[0, 128], 64);
        assert_ne!(c[0], c[1]);
        // A single flipped byte in slot 1 is caught in slot 1.
        b.copy_from_slice(&a);
        b[130] ^= 1;
        assert_eq!(first_mismatch(&checksums(&a, &[0, 128], 64), &checksums(&b, &[0, 128], 64)), Some(1));
        assert_eq!(first_mismatch(&[1, 2], &[1]), Some(1));
    }
}
