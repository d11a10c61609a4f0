//! [`PeerMap`]: values per (remote engine, remote memory id), e.g. a backend's cached
//! mappings of remote regions, looked up on the transfer path with no allocation (the engine
//! key is borrowed) and a cheap hash (FxHash; the keys are not attacker-chosen: engine keys
//! and ids come from descriptors this engine registered).

use crate::desc::MemId;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// A map from (engine key, memory id) to `V`, grouped per engine so that everything of one
/// peer can be dropped at once. Removed values are returned, so the caller drops them (and
/// whatever they release: IPC mappings, imported handles) outside the map's lock.
pub struct PeerMap<V> {
    m: Mutex<FxHashMap<String, FxHashMap<MemId, V>>>,
}

impl<V> Default for PeerMap<V> {
    fn default() -> Self {
        PeerMap { m: Mutex::new(FxHashMap::default()) }
    }
}

impl<V: Clone> PeerMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clone of the value of `(engine, id)`, if any.
    pub fn get(&self, engine: &str, id: MemId) -> Option<V> {
        self.m.lock().get(engine).and_then(|p| p.get(&id)).cloned()
    }

    /// The value of `(engine, id)`: the one already there, else `v` (inserted). Two threads
    /// resolving the same key at once thus end up with one value.
    pub fn get_or_insert(&self, engine: &str, id: MemId, v: V) -> V {
        let mut m = self.m.lock();
        if let Some(p) = m.get_mut(engine) {
            return p.entry(id).or_insert(v).clone();
        }
        m.entry(engine.to_string()).or_default().entry(id).or_insert(v).clone()
    }

    /// Removes and returns the value of `(engine, id)`.
    pub fn remove(&self, engine: &str, id: MemId) -> Option<V> {
        let mut m = self.m.lock();
        let p = m.get_mut(engine)?;
        let v = p.remove(&id);
        if p.is_empty() {
            m.remove(engine);
        }
        v
    }

    /// Removes and returns every value of `engine` (in no particular order).
    pub fn remove_engine(&self, engine: &str) -> Vec<V> {
        self.m.lock().remove(engine).map(|p| p.into_values().collect()).unwrap_or_default()
    }

    /// How many values the map holds.
    pub fn len(&self) -> usize {
        self.m.lock().values().map(FxHashMap::len).sum()
    }

    /// True when the map holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Step {
        GetOrInsert(u8, MemId, u32),
        Remove(u8, MemId),
        RemoveEngine(u8),
        Get(u8, MemId),
    }

    fn step() -> impl Strategy<Value = Step> {
        let e = 0u8..4;
        let id = 0u64..6;
        prop_oneof![
            (e.clone(), id.clone(), any::<u32>()).prop_map(|(e, i, v)| Step::GetOrInsert(e, i, v)),
            (e.clone(), id.clone()).prop_map(|(e, i)| Step::Remove(e, i)),
            e.clone().prop_map(Step::RemoveEngine),
            (e, id).prop_map(|(e, i)| Step::Get(e, i)),
        ]
    }

    proptest! {
        /// Against a plain ordered map keyed by (engine, id): every return value and the size
        /// agree after each step.
        #[test]
        fn behaves_as_a_map_keyed_by_engine_and_id(steps in proptest::collection::vec(step(), 0..200)) {
            let m = PeerMap::<u32>::new();
            let mut oracle: BTreeMap<(String, MemId), u32> = BTreeMap::new();
            let name = |e: u8| format!("engine-{e}");
            for s in steps {
                match s {
                    Step::GetOrInsert(e, i, v) => prop_assert_eq!(m.get_or_insert(&name(e), i, v), *oracle.entry((name(e), i)).or_insert(v)),
                    Step::Remove(e, i) => prop_assert_eq!(m.remove(&name(e), i), oracle.remove(&(name(e), i))),
                    Step::RemoveEngine(e) => {
                        let mut got = m.remove_engine(&name(e));
                        got.sort_unstable();
                        let keys: Vec<_> = oracle.keys().filter(|k| k.0 == name(e)).cloned().collect();
                        let mut want: Vec<u32> = keys.iter().filter_map(|k| oracle.remove(k)).collect();
                        want.sort_unstable();
                        prop_assert_eq!(got, want);
                    }
                    Step::Get(e, i) => prop_assert_eq!(m.get(&name(e), i), oracle.get(&(name(e), i)).copied()),
                }
                prop_assert_eq!(m.len(), oracle.len());
                prop_assert_eq!(m.is_empty(), oracle.is_empty());
            }
        }
    }
}
