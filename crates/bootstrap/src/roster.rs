//! The root's rendezvous bookkeeping (sans-IO): who arrived, on which connection, and
//! whether a hello is a duplicate, a reconnect or a world-size mismatch.

use std::net::SocketAddr;

use crate::error::BootstrapError;
use crate::wire::{Hello, Table};

#[derive(Clone, Debug)]
struct Arrival {
    conn: usize,
    from: SocketAddr,
    listen: SocketAddr,
    nonce: u64,
}

/// What to do with a hello.
#[derive(Debug)]
pub(crate) enum Admit {
    Accepted,
    /// Same process (same nonce) reconnected: drop the old connection.
    Replaced {
        old_conn: usize,
    },
    /// Fatal for the whole rendezvous: tell everyone, fail.
    Reject(BootstrapError),
}

/// Slots for ranks `0..world`; slot 0 is the root itself.
pub(crate) struct Roster {
    world: usize,
    master: SocketAddr,
    slots: Vec<Option<Arrival>>,
}

impl Roster {
    pub fn new(world: usize, master: SocketAddr) -> Roster {
        let mut slots = vec![None; world];
        if let Some(s) = slots.first_mut() {
            *s = Some(Arrival { conn: usize::MAX, from: master, listen: master, nonce: 0 });
        }
        Roster { world, master, slots }
    }

    /// Registers `hello` received on connection `conn` from `from`.
    pub fn admit(&mut self, conn: usize, from: SocketAddr, hello: &Hello) -> Admit {
        if hello.world_size != self.world {
            return Admit::Reject(BootstrapError::WorldSizeMismatch { rank: hello.rank, expected: self.world, got: hello.world_size });
        }
        let Some(slot) = self.slots.get_mut(hello.rank) else {
            return Admit::Reject(crate::wire::proto(
                &from.to_string(),
                format!("claims rank {} of a world of {}", hello.rank, self.world),
            ));
        };
        let new = Arrival { conn, from, listen: hello.listen, nonce: hello.nonce };
        match slot {
            None => {
                *slot = Some(new);
                Admit::Accepted
            }
            Some(old) if hello.rank != 0 && old.nonce == hello.nonce && old.conn != conn => {
                let old_conn = old.conn;
                *slot = Some(new);
                Admit::Replaced { old_conn }
            }
            Some(old) => {
                let first = if hello.rank == 0 { self.master } else { old.from };
                Admit::Reject(BootstrapError::DuplicateRank { rank: hello.rank, first, second: from })
            }
        }
    }

    /// Forgets the rank that arrived on `conn` (its connection closed before the table
    /// was sent); returns that rank.
    pub fn forget(&mut self, conn: usize) -> Option<usize> {
        let rank = self.slots.iter().position(|s| s.as_ref().is_some_and(|a| a.conn == conn && conn != usize::MAX))?;
        self.slots[rank] = None;
        Some(rank)
    }

    /// Ranks not arrived yet, ascending.
    pub fn missing(&self) -> Vec<usize> {
        self.slots.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(r, _)| r).collect()
    }

    pub fn is_complete(&self) -> bool {
        self.slots.iter().all(Option::is_some)
    }

    /// Connection ids of arrived ranks 1.., indexed by rank - 1 (None where missing).
    pub fn conns(&self) -> Vec<Option<usize>> {
        self.slots.iter().skip(1).map(|s| s.as_ref().map(|a| a.conn)).collect()
    }

    /// The address table (only meaningful once complete).
    pub fn table(&self, session: u64) -> Table {
        let addrs = self.slots.iter().map(|s| s.as_ref().map_or(self.master, |a| a.listen)).collect();
        Table { session, addrs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: usize, world: usize, nonce: u64) -> Hello {
        Hello { rank, world_size: world, listen: format!("10.0.0.{rank}:4000").parse().unwrap(), nonce, pid: 1 }
    }
    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn collects_until_complete() {
        let mut r = Roster::new(3, addr("10.0.0.1:18515"));
        assert_eq!(r.missing(), vec![1, 2]);
        assert!(matches!(r.admit(7, addr("10.0.0.2:1"), &hello(2, 3, 1)), Admit::Accepted));
        assert_eq!(r.missing(), vec![1]);
        assert!(!r.is_complete());
        assert_eq!(r.forget(7), Some(2));
        assert_eq!(r.missing(), vec![1, 2]);
        assert!(matches!(r.admit(8, addr("10.0.0.2:2"), &hello(2, 3, 1)), Admit::Accepted));
        assert!(matches!(r.admit(9, addr("10.0.0.3:1"), &hello(1, 3, 5)), Admit::Accepted));
        assert!(r.is_complete());
        assert_eq!(r.conns(), vec![Some(9), Some(8)]);
        let t = r.table(42);
        assert_eq!(t.addrs, vec![addr("10.0.0.1:18515"), addr("10.0.0.1:4000"), addr("10.0.0.2:4000")]);
    }

    #[test]
    fn duplicates_mismatches_reconnects() {
        let mut r = Roster::new(3, addr("10.0.0.1:18515"));
        assert!(matches!(r.admit(1, addr("10.0.0.2:1"), &hello(1, 3, 11)), Admit::Accepted));
        assert!(matches!(r.admit(2, addr("10.0.0.2:2"), &hello(1, 3, 11)), Admit::Replaced { old_conn: 1 }));
        match r.admit(3, addr("10.0.0.3:3"), &hello(1, 3, 12)) {
            Admit::Reject(BootstrapError::DuplicateRank { rank: 1, first, second }) => {
                assert_eq!((first, second), (addr("10.0.0.2:2"), addr("10.0.0.3:3")));
            }
            other => panic!("{other:?}"),
        }
        match r.admit(4, addr("10.0.0.4:4"), &hello(2, 4, 1)) {
            Admit::Reject(BootstrapError::WorldSizeMismatch { rank: 2, expected: 3, got: 4 }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(r.admit(5, addr("10.0.0.5:5"), &hello(0, 3, 0)), Admit::Reject(BootstrapError::DuplicateRank { rank: 0, .. })));
        assert!(matches!(r.admit(6, addr("10.0.0.6:6"), &hello(3, 3, 0)), Admit::Reject(BootstrapError::Protocol { .. })));
        assert_eq!(r.forget(usize::MAX), None);
    }
}
