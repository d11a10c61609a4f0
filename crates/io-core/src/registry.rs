//! Local registrations and the bounds check every backend applies before touching memory.

use crate::desc::{MemId, MemLoc};
use crate::error::{IoError, IoResult};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One registered region of this process. Holding an `Arc<Region>` keeps deregistration from
/// completing (it waits, with a deadline, until no in-flight operation holds the region).
#[derive(Debug)]
pub struct Region {
    /// Region id (unique within the engine).
    pub id: MemId,
    /// First byte's address in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: u64,
    /// Host or GPU.
    pub loc: MemLoc,
}

impl Region {
    /// Checks that `[offset, offset+len)` lies inside the region and returns the address of
    /// `offset`. Errors: `InvalidArgs` naming the range, the region and its size (overflow
    /// included).
    pub fn range(&self, offset: u64, len: u64) -> IoResult<usize> {
        check_range(self.id, self.len, offset, len)?;
        Ok(self.addr + offset as usize)
    }
}

/// Pure bounds check of `[offset, offset+len)` against a region of `region_len` bytes.
pub fn check_range(id: MemId, region_len: u64, offset: u64, len: u64) -> IoResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(IoError::invalid(format!("range offset {offset} + length {len} exceeds region {id} of {region_len} bytes"))),
    }
}

/// The engine's table of local registrations, shared with every backend.
#[derive(Default, Debug)]
pub struct MemRegistry {
    regions: RwLock<HashMap<MemId, Arc<Region>>>,
    /// Regions being deregistered whose drain timed out: no new operation finds them, and a
    /// retry of [`MemRegistry::remove`] waits for them again.
    draining: Mutex<HashMap<MemId, Arc<Region>>>,
}

impl MemRegistry {
    /// Empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a region. Errors: `InvalidArgs` for a duplicate id, a zero length or a range that
    /// wraps the address space.
    pub fn insert(&self, region: Region) -> IoResult<Arc<Region>> {
        if region.len == 0 {
            return Err(IoError::invalid("cannot register a region of 0 bytes"));
        }
        if (region.addr as u64).checked_add(region.len).is_none() {
            return Err(IoError::invalid(format!("region at {:#x} of {} bytes wraps the address space", region.addr, region.len)));
        }
        let mut g = self.regions.write();
        if g.contains_key(&region.id) {
            return Err(IoError::invalid(format!("region id {} is already registered", region.id)));
        }
        let r = Arc::new(region);
        g.insert(r.id, r.clone());
        Ok(r)
    }

    /// The region with this id. Errors: `NotFound` ("memory 7 is not registered").
    pub fn get(&self, id: MemId) -> IoResult<Arc<Region>> {
        self.regions
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| IoError::not_found(format!("memory {id} is not registered (never, or deregistered)")))
    }

    /// Number of live regions.
    pub fn len(&self) -> usize {
        self.regions.read().len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes a region so no new operation can use it, then waits up to `drain` for in-flight
    /// operations holding it to finish.
    ///
    /// Errors: `NotFound` if not registered (a second deregistration is an error, not a double
    /// free); `Timeout` if operations still hold it after `drain`: the region then stays
    /// *draining* (no new operation finds it) and the memory must not be freed yet; calling
    /// `remove` again waits again, and returns `Ok` once the last operation let go.
    pub fn remove(&self, id: MemId, drain: Duration) -> IoResult<()> {
        let r = match self.regions.write().remove(&id) {
            Some(r) => r,
            None => self
                .draining
                .lock()
                .remove(&id)
                .ok_or_else(|| IoError::not_found(format!("memory {id} is not registered (double deregistration?)")))?,
        };
        let deadline = Instant::now() + drain;
        while Arc::strong_count(&r) > 1 {
            if Instant::now() >= deadline {
                let users = Arc::strong_count(&r) - 1;
                self.draining.lock().insert(id, r);
                return Err(IoError::timeout(format!(
                    "memory {id} is draining: {users} in-flight operation(s) still use it after {drain:?}; new operations are refused; \
                     do not free it yet, deregister it again to wait for the drain"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Ids of regions whose deregistration timed out and that are still draining.
    pub fn draining(&self) -> Vec<MemId> {
        let mut v: Vec<MemId> = self.draining.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lifecycle() {
        let reg = MemRegistry::new();
        let r = reg.insert(Region { id: 1, addr: 0x1000, len: 100, loc: MemLoc::Host { numa: None } }).unwrap();
        assert_eq!(r.range(10, 90).unwrap(), 0x1000 + 10);
        assert!(r.range(10, 91).unwrap_err().msg.contains("exceeds region 1 of 100 bytes"));
        assert!(reg.insert(Region { id: 1, addr: 0, len: 1, loc: MemLoc::Host { numa: None } }).is_err());
        drop(r);
        reg.remove(1, Duration::from_secs(1)).unwrap();
        assert_eq!(reg.remove(1, Duration::from_secs(1)).unwrap_err().code, crate::ErrorCode::NotFound);
        assert_eq!(reg.get(1).unwrap_err().code, crate::ErrorCode::NotFound);
    }

    #[test]
    fn remove_waits_for_holders_with_deadline() {
        let reg = MemRegistry::new();
        let r = reg.insert(Region { id: 2, addr: 0x1000, len: 8, loc: MemLoc::Host { numa: None } }).unwrap();
        let e = reg.remove(2, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::Timeout);
        assert!(e.msg.contains("draining") && e.msg.contains("deregister it again"), "{e}");
        // Draining: new operations do not find it, a retry waits again (and times out again
        // while the holder is there), then succeeds once the holder let go.
        assert_eq!(reg.get(2).unwrap_err().code, crate::ErrorCode::NotFound);
        assert_eq!(reg.draining(), vec![2]);
        assert_eq!(reg.remove(2, Duration::from_millis(5)).unwrap_err().code, crate::ErrorCode::Timeout);
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(r);
        });
        reg.remove(2, Duration::from_secs(5)).unwrap();
        holder.join().unwrap();
        assert!(reg.draining().is_empty());
        assert_eq!(reg.remove(2, Duration::from_secs(1)).unwrap_err().code, crate::ErrorCode::NotFound);
    }

    proptest! {
        #[test]
        fn check_range_matches_oracle(len in any::<u64>(), off in any::<u64>(), n in any::<u64>()) {
            let oracle = (off as u128) + (n as u128) <= len as u128;
            prop_assert_eq!(check_range(0, len, off, n).is_ok(), oracle);
        }
    }
}
