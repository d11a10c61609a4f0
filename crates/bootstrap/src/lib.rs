//! Out-of-band rendezvous for MORI ranks (see DESIGN.md, "foundations").
//!
//! API contract used by the rest of the workspace (implementation in progress):
//! the [`Bootstrap`] trait below.

use std::time::Duration;

/// Errors of the bootstrap layer. Every variant names the culprit (rank, address, limit).
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// Placeholder while the crate is being written.
    #[error("{0}")]
    Other(String),
}

/// Out-of-band collectives among `world_size` ranks. Every call has a deadline.
pub trait Bootstrap: Send + Sync {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank contributes `data`; returns all contributions indexed by rank.
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// `data[j]` goes to rank `j`; returns what every rank sent to this one, indexed by source.
    fn all_to_all(&self, data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// `root` passes `Some(bytes)`, the others `None`; every rank returns the root's bytes.
    fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError>;
    /// Returns once every rank entered the barrier.
    fn barrier(&self) -> Result<(), BootstrapError>;
    /// The deadline applied to each collective.
    fn timeout(&self) -> Duration;
}
