//! The cache itself: an id-keyed table, a start-address index of findable registrations and
//! an LRU queue of unused ones.

use crate::{MemDomain, MrError, RegId, RegInfo, Registrar};
use std::collections::{BTreeMap, BTreeSet};

struct Entry<H> {
    domain: MemDomain,
    addr: u64,
    len: u64,
    refs: u32,
    stale: bool,
    /// Key in the LRU queue while `refs == 0`.
    tick: u64,
    handle: H,
}

/// A registration cache over a [`Registrar`] with a budget in bytes (see the crate rules).
///
/// Lookups cost `O(log n + k)` where `k` counts registrations starting within the longest
/// registration's length before the range end. Dropping the cache deregisters everything
/// still registered (with a warning for registrations still in use).
pub struct MrCache<R: Registrar> {
    reg: R,
    budget: u64,
    /// Registered bytes: every live registration, stale ones included.
    used: u64,
    /// Bytes of unused registrations (those in `lru`).
    unused: u64,
    next_id: u64,
    tick: u64,
    /// Longest findable registration ever inserted (bounds the lookup scans).
    max_len: u64,
    entries: BTreeMap<RegId, Entry<R::Handle>>,
    /// (domain, start address, id) of every findable (not stale) registration.
    by_start: BTreeSet<(MemDomain, u64, RegId)>,
    /// tick of release -> id, for registrations with no reference.
    lru: BTreeMap<u64, RegId>,
}

impl<R: Registrar> MrCache<R> {
    /// An empty cache that keeps at most `budget` bytes registered through `registrar`.
    pub fn new(registrar: R, budget: u64) -> Self {
        MrCache {
            reg: registrar,
            budget,
            used: 0,
            unused: 0,
            next_id: 1,
            tick: 0,
            max_len: 0,
            entries: BTreeMap::new(),
            by_start: BTreeSet::new(),
            lru: BTreeMap::new(),
        }
    }

    /// Returns a registration of `domain` containing `[addr, addr + len)` with one more
    /// reference: a cached one if any (the one that starts last, the newest on ties), else a
    /// new one of exactly that range, evicting unused registrations (of any domain) least
    /// recently used first to stay within the budget. Registrations of another domain are
    /// never returned, whatever their addresses.
    ///
    /// Errors: [`MrError::InvalidRange`] (zero length, overflow), [`MrError::TooLarge`],
    /// [`MrError::OverBudget`] (nothing is evicted then), [`MrError::Register`].
    pub fn acquire(&mut self, domain: MemDomain, addr: u64, len: u64) -> Result<RegId, MrError> {
        check_range(addr, len)?;
        self.tick += 1;
        if let Some(id) = self.lookup(domain, addr, len) {
            if let Some(e) = self.entries.get_mut(&id) {
                if e.refs == 0 {
                    self.lru.remove(&e.tick);
                    self.unused -= e.len;
                }
                e.refs += 1;
                return Ok(id);
            }
        }
        if len > self.budget {
            return Err(MrError::TooLarge { addr, len, budget: self.budget });
        }
        let in_use = self.used - self.unused;
        if in_use + len > self.budget {
            return Err(MrError::OverBudget { addr, len, budget: self.budget, in_use, evictable: self.unused });
        }
        while self.used + len > self.budget {
            let Some((_, victim)) = self.lru.pop_first() else { break };
            tracing::debug!(%victim, "MR cache: evicting the least recently used registration");
            self.drop_entry(victim);
        }
        let handle = self.reg.register(domain, addr, len).map_err(|e| MrError::Register { domain, addr, len, source: Box::new(e) })?;
        let id = RegId(self.next_id);
        self.next_id += 1;
        self.entries.insert(id, Entry { domain, addr, len, refs: 1, stale: false, tick: 0, handle });
        self.by_start.insert((domain, addr, id));
        self.used += len;
        self.max_len = self.max_len.max(len);
        Ok(id)
    }

    /// Drops one reference of `id` and returns the references left. At zero the registration
    /// stays cached (evictable), unless it was invalidated: then it is deregistered now.
    ///
    /// Errors: [`MrError::NotHeld`] when it has no reference, [`MrError::Unknown`] when it
    /// no longer exists; the registrar is not called in either case.
    pub fn release(&mut self, id: RegId) -> Result<u32, MrError> {
        self.tick += 1;
        let e = self.entries.get_mut(&id).ok_or(MrError::Unknown { id })?;
        if e.refs == 0 {
            return Err(MrError::NotHeld { id, addr: e.addr, len: e.len });
        }
        e.refs -= 1;
        let left = e.refs;
        if left == 0 {
            if e.stale {
                self.drop_entry(id);
            } else {
                e.tick = self.tick;
                self.unused += e.len;
                self.lru.insert(self.tick, id);
            }
        }
        Ok(left)
    }

    /// The memory `[addr, addr + len)` of `domain` is going away: every registration of that
    /// domain overlapping it becomes unfindable; unused ones are deregistered now, used ones
    /// at their last release. Returns how many registrations were invalidated (0 for an empty
    /// range).
    pub fn invalidate(&mut self, domain: MemDomain, addr: u64, len: u64) -> usize {
        let end = addr.saturating_add(len);
        if len == 0 {
            return 0;
        }
        let from = (domain, addr.saturating_sub(self.max_len), RegId(0));
        let hits: Vec<(MemDomain, u64, RegId)> = self
            .by_start
            .range(from..(domain, end, RegId(0)))
            .filter(|(_, _, id)| self.entries.get(id).is_some_and(|e| e.addr + e.len > addr))
            .copied()
            .collect();
        for key in &hits {
            self.by_start.remove(key);
            let Some(e) = self.entries.get_mut(&key.2) else { continue };
            if e.refs == 0 {
                self.drop_entry(key.2);
            } else {
                e.stale = true;
            }
        }
        hits.len()
    }

    /// Deregisters every unused registration; returns how many.
    pub fn evict_unused(&mut self) -> usize {
        let ids: Vec<RegId> = self.lru.values().copied().collect();
        for &id in &ids {
            self.drop_entry(id);
        }
        ids.len()
    }

    /// The findable registration of `domain` containing `[addr, addr + len)`, if any (same
    /// choice as [`MrCache::acquire`]); changes nothing.
    pub fn lookup(&self, domain: MemDomain, addr: u64, len: u64) -> Option<RegId> {
        let end = addr.checked_add(len)?;
        let lowest = end.saturating_sub(self.max_len);
        if lowest > addr {
            return None; // longer than any registration (and an empty range would panic)
        }
        self.by_start
            .range((domain, lowest, RegId(0))..=(domain, addr, RegId(u64::MAX)))
            .rev()
            .find(|(_, _, id)| self.entries.get(id).is_some_and(|e| e.addr + e.len >= end))
            .map(|&(_, _, id)| id)
    }

    /// The registrar's handle of `id` (e.g. to read lkey/rkey), while it exists.
    pub fn handle(&self, id: RegId) -> Option<&R::Handle> {
        self.entries.get(&id).map(|e| &e.handle)
    }

    /// State of `id`, while it exists.
    pub fn info(&self, id: RegId) -> Option<RegInfo> {
        self.entries.get(&id).map(|e| RegInfo { domain: e.domain, addr: e.addr, len: e.len, refs: e.refs, stale: e.stale })
    }

    /// Registered bytes (registrations in use, unused and stale).
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Bytes of unused (evictable) registrations.
    pub fn unused_bytes(&self) -> u64 {
        self.unused
    }

    /// The budget, bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The registrar (e.g. to inspect a fake in tests).
    pub fn registrar(&self) -> &R {
        &self.reg
    }

    /// Removes `id` from every table and deregisters its handle (the only deregister call).
    fn drop_entry(&mut self, id: RegId) {
        let Some(e) = self.entries.remove(&id) else { return };
        self.by_start.remove(&(e.domain, e.addr, id));
        if e.refs == 0 && !e.stale {
            // Unused: in the LRU queue, unless eviction just popped it.
            self.lru.remove(&e.tick);
            self.unused -= e.len;
        }
        self.used -= e.len;
        self.reg.deregister(e.handle);
    }
}

impl<R: Registrar> Drop for MrCache<R> {
    fn drop(&mut self) {
        let held = self.entries.values().filter(|e| e.refs > 0).count();
        if held > 0 {
            tracing::warn!(held, "MR cache dropped while registrations are in use; deregistering them");
        }
        let entries = std::mem::take(&mut self.entries);
        for (_, e) in entries {
            self.reg.deregister(e.handle);
        }
    }
}

fn check_range(addr: u64, len: u64) -> Result<(), MrError> {
    if len == 0 {
        return Err(MrError::InvalidRange { addr, len, why: "zero length" });
    }
    if addr.checked_add(len).is_none() {
        return Err(MrError::InvalidRange { addr, len, why: "end overflows the address space" });
    }
    Ok(())
}
