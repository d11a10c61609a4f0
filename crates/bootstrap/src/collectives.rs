//! The socket collectives over a rank's [`Mesh`]: ring allgather and all_to_all, star
//! (through rank 0) broadcast and barrier.

use crate::error::BootstrapError;
use crate::mesh::{Ctx, Mesh};
use crate::wire::{decode_blocks, encode_blocks};

/// Connections of one rank and where they lead.
pub(crate) struct Links {
    pub mesh: Mesh,
    /// Rank 0: connection id of rank `r` at index `r - 1`. Others: `[id of rank 0]`.
    pub star: Vec<usize>,
    /// Ring successor `(rank + 1) % n` (send side).
    pub next: usize,
    /// Ring predecessor `(rank - 1) % n` (receive side).
    pub prev: usize,
    pub me: usize,
    pub n: usize,
}

impl Links {
    fn one(&mut self, ctx: &Ctx, from: usize) -> Result<Vec<u8>, BootstrapError> {
        Ok(self.mesh.exchange(ctx, &[from])?.pop().unwrap_or_default())
    }

    /// Ring allgather: at step `s` pass the block of rank `me - s` on, receive `me - s - 1`.
    pub fn allgather(&mut self, ctx: &Ctx, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let (me, n) = (self.me, self.n);
        let mut out = vec![Vec::new(); n];
        out[me] = data.to_vec();
        for s in 0..n.saturating_sub(1) {
            let send = out[(me + n - s) % n].clone();
            self.mesh.send(self.next, ctx, send);
            out[(me + 2 * n - s - 1) % n] = self.one(ctx, self.prev)?;
        }
        Ok(out)
    }

    /// Ring all_to_all: each rank's bundle of blocks for `me+1 .. me+n-1` travels around
    /// the ring; every hop keeps the first block and forwards the rest.
    pub fn all_to_all(&mut self, ctx: &Ctx, mut data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let (me, n) = (self.me, self.n);
        let mut out = vec![Vec::new(); n];
        out[me] = std::mem::take(&mut data[me]);
        let mut bundle: Vec<Vec<u8>> = (1..n).map(|k| std::mem::take(&mut data[(me + k) % n])).collect();
        for s in 1..n {
            self.mesh.send(self.next, ctx, encode_blocks(bundle.iter().map(Vec::as_slice)));
            let got = self.one(ctx, self.prev)?;
            let from = self.mesh.conns[self.prev].name.clone();
            let mut blocks = decode_blocks(&got, &from, n - s)?.into_iter();
            out[(me + n - s) % n] = blocks.next().unwrap_or_default();
            bundle = blocks.collect();
        }
        Ok(out)
    }

    /// Star broadcast: a non-zero root sends to rank 0, rank 0 sends to everyone else.
    pub fn broadcast(&mut self, ctx: &Ctx, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError> {
        let me = self.me;
        if me == root {
            let bytes = data.unwrap_or_default().to_vec();
            if self.n > 1 {
                let targets: Vec<usize> = if me == 0 { self.star.clone() } else { vec![self.star[0]] };
                for c in targets {
                    self.mesh.send(c, ctx, bytes.clone());
                }
                self.mesh.exchange(ctx, &[])?;
            }
            return Ok(bytes);
        }
        if me != 0 {
            return self.one(ctx, self.star[0]);
        }
        let bytes = self.one(ctx, self.star[root - 1])?;
        for (i, &c) in self.star.clone().iter().enumerate() {
            if i + 1 != root {
                self.mesh.send(c, ctx, bytes.clone());
            }
        }
        self.mesh.exchange(ctx, &[])?;
        Ok(bytes)
    }

    /// Star barrier: everyone checks in at rank 0, which releases all once complete.
    pub fn barrier(&mut self, ctx: &Ctx) -> Result<(), BootstrapError> {
        if self.n == 1 {
            return Ok(());
        }
        if self.me == 0 {
            let star = self.star.clone();
            self.mesh.exchange(ctx, &star)?;
            for &c in &star {
                self.mesh.send(c, ctx, Vec::new());
            }
            self.mesh.exchange(ctx, &[])?;
        } else {
            self.mesh.send(self.star[0], ctx, Vec::new());
            self.mesh.exchange(ctx, &[self.star[0]])?;
        }
        Ok(())
    }
}
