//! Unit tests with a counting fake registrar, and a property test against a Vec-based model.

use crate::{MemDomain, MrCache, MrError, RegId, RegInfo, Registrar};

const H: MemDomain = MemDomain::Host;
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// What the fake registrar saw: live handles, call counts and misuse.
#[derive(Default, Debug)]
struct Log {
    next: u64,
    live: BTreeMap<u64, (MemDomain, u64, u64)>,
    registers: usize,
    deregisters: usize,
    violations: Vec<String>,
}

/// Fake of the leaf `ibv_reg_mr`/`ibv_dereg_mr` calls; refuses any registration of 13 bytes.
struct Fake(Rc<RefCell<Log>>);
/// Deliberately not `Clone`: the cache cannot hand a handle out twice.
#[derive(Debug)]
struct FakeHandle(u64);
#[derive(Debug, thiserror::Error)]
#[error("fake registrar refuses {0} bytes")]
struct FakeErr(u64);
const FAIL_LEN: u64 = 13;

impl Registrar for Fake {
    type Handle = FakeHandle;
    type Error = FakeErr;
    fn register(&mut self, domain: MemDomain, addr: u64, len: u64) -> Result<FakeHandle, FakeErr> {
        let mut l = self.0.borrow_mut();
        if len == FAIL_LEN {
            return Err(FakeErr(len));
        }
        l.registers += 1;
        l.next += 1;
        let h = l.next;
        l.live.insert(h, (domain, addr, len));
        Ok(FakeHandle(h))
    }
    fn deregister(&mut self, h: FakeHandle) {
        let mut l = self.0.borrow_mut();
        l.deregisters += 1;
        if l.live.remove(&h.0).is_none() {
            l.violations.push(format!("handle {} freed twice or never registered", h.0));
        }
    }
}

fn cache(budget: u64) -> (MrCache<Fake>, Rc<RefCell<Log>>) {
    let log = Rc::new(RefCell::new(Log::default()));
    (MrCache::new(Fake(log.clone()), budget), log)
}

#[test]
fn duplicate_range_shares_and_double_release_is_an_error() {
    let (mut c, log) = cache(1 << 20);
    let a = c.acquire(H, 0x1000, 4096).unwrap();
    assert_eq!(c.acquire(H, 0x1000, 4096).unwrap(), a, "same range, same registration");
    assert_eq!(c.acquire(H, 0x1800, 16).unwrap(), a, "contained range, same registration");
    assert_eq!(c.handle(a).map(|h| h.0), Some(1));
    assert_eq!(c.info(a), Some(RegInfo { domain: H, addr: 0x1000, len: 4096, refs: 3, stale: false }));
    assert_eq!(log.borrow().registers, 1);
    assert_eq!([c.release(a).unwrap(), c.release(a).unwrap(), c.release(a).unwrap()], [2, 1, 0]);
    let e = c.release(a).unwrap_err();
    assert!(matches!(e, MrError::NotHeld { .. }) && e.to_string().contains("released more times"), "{e}");
    assert_eq!(log.borrow().deregisters, 0, "unused registrations stay cached");
    assert_eq!(c.invalidate(H, 0x1fff, 1), 1);
    assert!(matches!(c.release(a), Err(MrError::Unknown { .. })));
    let l = log.borrow();
    assert_eq!((l.deregisters, l.live.len(), l.violations.len()), (1, 0, 0));
}

#[test]
fn lru_evicts_oldest_unused_only() {
    let (mut c, log) = cache(30);
    let [a, b, d] = [0, 100, 200].map(|addr| c.acquire(H, addr, 10).unwrap());
    for id in [a, d, b] {
        c.release(id).unwrap();
    }
    let e = c.acquire(H, 300, 10).unwrap();
    assert!(c.info(a).is_none() && c.info(d).is_some(), "a was released first");
    c.acquire(H, 400, 10).unwrap();
    assert!(c.info(d).is_none());
    assert_eq!(c.acquire(H, 100, 10).unwrap(), b, "b is still cached");
    assert_eq!((log.borrow().registers, c.used_bytes(), c.unused_bytes()), (5, 30, 0));
    // Everything is in use now: no room, nothing evicted.
    let err = c.acquire(H, 500, 10).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("budget of 30 bytes cannot fit 10 bytes at 0x1f4") && msg.contains("30 bytes are held"), "{msg}");
    assert!(c.acquire(H, 0, 31).unwrap_err().to_string().contains("exceeds the MR cache budget of 30 bytes"));
    assert_eq!(c.len(), 3);
    c.release(e).unwrap();
    assert_eq!(c.evict_unused(), 1);
    drop(c);
    let l = log.borrow();
    assert_eq!((l.registers, l.deregisters, l.live.len(), l.violations.len()), (5, 5, 0, 0));
}

#[test]
fn invalidate_in_use_defers_and_errors_name_the_input() {
    let (mut c, log) = cache(100);
    let a = c.acquire(H, 0, 10).unwrap();
    assert_eq!(c.invalidate(H, 5, 100), 1);
    assert!(c.info(a).is_some_and(|i| i.stale) && c.lookup(H, 0, 10).is_none());
    let b = c.acquire(H, 0, 10).unwrap();
    assert_ne!(a, b, "a stale registration is never handed out again");
    assert_eq!(c.release(a).unwrap(), 0);
    assert!(c.info(a).is_none() && log.borrow().deregisters == 1);
    assert_eq!(c.invalidate(H, 0, 0), 0);
    let e = c.acquire(H, 50, FAIL_LEN).unwrap_err();
    assert!(matches!(e, MrError::Register { .. }) && e.to_string().contains("fake registrar refuses 13"), "{e}");
    assert!(c.acquire(H, u64::MAX - 3, 8).unwrap_err().to_string().contains("overflows"));
    assert!(c.acquire(H, 8, 0).unwrap_err().to_string().contains("zero length"));
    assert!(c.release(RegId(77)).unwrap_err().to_string().contains("unknown registration mr#77"));
}

#[test]
fn domains_never_share_registrations() {
    let (mut c, log) = cache(1 << 20);
    let host = c.acquire(H, 0x1000, 4096).unwrap();
    let gpu0 = c.acquire(MemDomain::Gpu(0), 0x1000, 4096).unwrap();
    let gpu1 = c.acquire(MemDomain::Gpu(1), 0x1800, 16).unwrap();
    assert!(host != gpu0 && gpu0 != gpu1, "same addresses, three domains, three registrations");
    assert_eq!(c.lookup(MemDomain::Gpu(0), 0x1800, 16), Some(gpu0));
    assert_eq!(c.lookup(H, 0x1800, 16), Some(host));
    assert_eq!(c.info(gpu1).map(|i| (i.domain, i.addr, i.len)), Some((MemDomain::Gpu(1), 0x1800, 16)));
    // Invalidating host memory leaves the GPU registrations findable.
    assert_eq!(c.invalidate(H, 0, 1 << 16), 1);
    assert_eq!(c.lookup(MemDomain::Gpu(0), 0x1000, 4096), Some(gpu0));
    assert_eq!(c.lookup(H, 0x1000, 4096), None);
    let l = log.borrow();
    let mut doms: Vec<MemDomain> = l.live.values().map(|v| v.0).collect();
    doms.sort_unstable();
    assert_eq!(doms, [H, MemDomain::Gpu(0), MemDomain::Gpu(1)], "the registrar saw each request's domain");
    drop(l);
    let e = c.acquire(MemDomain::Gpu(3), 64, FAIL_LEN).unwrap_err();
    assert!(e.to_string().contains("of GPU 3 memory at 0x40"), "{e}");
}

// ----- model -----

#[derive(Debug, Clone, PartialEq)]
struct MEntry {
    id: u64,
    dom: MemDomain,
    addr: u64,
    len: u64,
    refs: u32,
    stale: bool,
    last: u64,
}

/// The oracle: a plain Vec, linear scans, the rules spelled out directly.
#[derive(Default)]
struct Model {
    budget: u64,
    v: Vec<MEntry>,
    next: u64,
    tick: u64,
}

impl Model {
    fn acquire(&mut self, dom: MemDomain, addr: u64, len: u64) -> Result<u64, &'static str> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err("InvalidRange");
        }
        self.tick += 1;
        let hit = self.v.iter_mut().filter(|e| !e.stale && e.dom == dom && e.addr <= addr && e.addr + e.len >= addr + len);
        if let Some(e) = hit.max_by_key(|e| (e.addr, e.id)) {
            e.refs += 1;
            return Ok(e.id);
        }
        let used = |v: &Vec<MEntry>| v.iter().map(|e| e.len).sum::<u64>();
        let held: u64 = self.v.iter().filter(|e| e.refs > 0).map(|e| e.len).sum();
        if len > self.budget {
            return Err("TooLarge");
        }
        if held + len > self.budget {
            return Err("OverBudget");
        }
        while used(&self.v) + len > self.budget {
            let victim = (0..self.v.len()).filter(|&i| self.v[i].refs == 0).min_by_key(|&i| self.v[i].last);
            self.v.remove(victim.expect("held bytes fit, so something is unused"));
        }
        if len == FAIL_LEN {
            return Err("Register");
        }
        self.next += 1;
        self.v.push(MEntry { id: self.next, dom, addr, len, refs: 1, stale: false, last: 0 });
        Ok(self.next)
    }
    fn release(&mut self, id: u64) -> Result<u32, &'static str> {
        self.tick += 1;
        let i = self.v.iter().position(|e| e.id == id).ok_or("Unknown")?;
        let e = &mut self.v[i];
        if e.refs == 0 {
            return Err("NotHeld");
        }
        e.refs -= 1;
        e.last = self.tick;
        let left = e.refs;
        if left == 0 && e.stale {
            self.v.remove(i);
        }
        Ok(left)
    }
    fn invalidate(&mut self, dom: MemDomain, addr: u64, len: u64) -> usize {
        let hit = |e: &MEntry| len > 0 && !e.stale && e.dom == dom && e.addr < addr + len && addr < e.addr + e.len;
        let n = self.v.iter().filter(|e| hit(e)).count();
        self.v.retain(|e| !(hit(e) && e.refs == 0));
        self.v.iter_mut().filter(|e| hit(e)).for_each(|e| e.stale = true);
        n
    }
}

fn kind(e: &MrError) -> &'static str {
    match e {
        MrError::InvalidRange { .. } => "InvalidRange",
        MrError::TooLarge { .. } => "TooLarge",
        MrError::OverBudget { .. } => "OverBudget",
        MrError::Register { .. } => "Register",
        MrError::NotHeld { .. } => "NotHeld",
        MrError::Unknown { .. } => "Unknown",
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(MemDomain, u64, u64),
    Release(usize),
    Invalidate(MemDomain, u64, u64),
    Evict,
}

/// Host memory mostly, GPU 0 and 1 sometimes (same addresses: domains must not mix).
fn dom() -> impl Strategy<Value = MemDomain> {
    prop_oneof![3 => Just(MemDomain::Host), 1 => Just(MemDomain::Gpu(0)), 1 => Just(MemDomain::Gpu(1))]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (dom(), 0u64..64, 0u64..24).prop_map(|(d, a, l)| Op::Acquire(d, a, l)),
        4 => (0usize..20).prop_map(Op::Release),
        1 => (dom(), 0u64..64, 0u64..24).prop_map(|(d, a, l)| Op::Invalidate(d, a, l)),
        1 => Just(Op::Evict),
    ]
}

proptest! {
    #[test]
    fn cache_matches_model(budget in 0u64..80, ops in proptest::collection::vec(op(), 1..60)) {
        let (mut c, log) = cache(budget);
        let mut m = Model { budget, ..Model::default() };
        for op in ops {
            match op {
                Op::Acquire(d, a, l) => {
                    prop_assert_eq!(c.acquire(d, a, l).map(|id| id.0).map_err(|e| kind(&e)), m.acquire(d, a, l));
                }
                Op::Release(k) => {
                    // Mostly issued ids (including gone ones), sometimes one never issued.
                    let id = if k < 18 && m.next > 0 { k as u64 % m.next + 1 } else { 1000 + k as u64 };
                    prop_assert_eq!(c.release(RegId(id)).map_err(|e| kind(&e)), m.release(id));
                }
                Op::Invalidate(d, a, l) => prop_assert_eq!(c.invalidate(d, a, l), m.invalidate(d, a, l)),
                Op::Evict => {
                    let n = m.v.iter().filter(|e| e.refs == 0).count();
                    m.v.retain(|e| e.refs > 0);
                    prop_assert_eq!(c.evict_unused(), n);
                }
            }
            prop_assert_eq!(c.len(), m.v.len());
            prop_assert_eq!(c.used_bytes(), m.v.iter().map(|e| e.len).sum::<u64>());
            prop_assert!(c.used_bytes() <= budget);
            for e in &m.v {
                let want = RegInfo { domain: e.dom, addr: e.addr, len: e.len, refs: e.refs, stale: e.stale };
                prop_assert_eq!(c.info(RegId(e.id)), Some(want));
            }
            let l = log.borrow();
            let mut live: Vec<(MemDomain, u64, u64)> = l.live.values().copied().collect();
            let mut want: Vec<(MemDomain, u64, u64)> = m.v.iter().map(|e| (e.dom, e.addr, e.len)).collect();
            live.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(live, want);
            prop_assert!(l.violations.is_empty(), "{:?}", l.violations);
        }
        drop(c);
        let l = log.borrow();
        prop_assert!(l.live.is_empty() && l.violations.is_empty() && l.registers == l.deregisters);
    }
}
