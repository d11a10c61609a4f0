//! Memory-registration (MR) cache of MORI: registering memory with an RDMA device
//! (`ibv_reg_mr`) is slow, so registrations are cached and shared.
//!
//! Rules (the project's RDMA issue):
//! - A lookup finds a cached registration *containing* `[addr, addr + len)`; acquiring a range
//!   already covered returns that same registration with one more reference.
//! - Every acquire is matched by one release; releasing more often than acquired is
//!   [`MrError::NotHeld`] (or [`MrError::Unknown`] once the registration is gone), never a
//!   second call to [`Registrar::deregister`].
//! - [`MrCache::invalidate`] (the memory is being freed or deregistered by its owner) makes
//!   every overlapping registration unfindable; unused ones are deregistered at once, used ones
//!   when their last reference is released.
//! - The cache holds at most `budget` registered bytes. Unused registrations (refcount 0) stay
//!   cached for reuse and are evicted least recently used first when a new one needs room;
//!   registrations in use are never evicted.
//!
//! The cache is sans-IO: the actual registration is done by a [`Registrar`] (the verbs
//! backend plugs `ibv_reg_mr`/`ibv_dereg_mr` in; tests use a counting fake).

mod cache;
#[cfg(test)]
mod tests;

pub use cache::MrCache;

/// Registers and deregisters memory with a device; the only side effect the cache has.
pub trait Registrar {
    /// What a registration yields (for verbs: the `ibv_mr` with its lkey/rkey).
    type Handle;
    /// Why a registration failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Registers `len` bytes (> 0) at address `addr` of `domain` (host memory, or a GPU's
    /// memory, which a verbs registrar registers through a dmabuf).
    fn register(&mut self, domain: MemDomain, addr: u64, len: u64) -> Result<Self::Handle, Self::Error>;
    /// Deregisters a handle returned by [`Registrar::register`]; called exactly once per handle.
    fn deregister(&mut self, handle: Self::Handle);
}

/// Which memory an address belongs to. Registrations of different domains never match each
/// other's lookups, even where their address ranges coincide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemDomain {
    /// Host memory (`ibv_reg_mr`).
    Host,
    /// Memory of the GPU with this device ordinal (`ibv_reg_dmabuf_mr`).
    Gpu(u32),
}

impl std::fmt::Display for MemDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemDomain::Host => write!(f, "host memory"),
            MemDomain::Gpu(d) => write!(f, "GPU {d} memory"),
        }
    }
}

/// Identifies one registration of a cache; ids are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegId(pub u64);

impl std::fmt::Display for RegId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mr#{}", self.0)
    }
}

/// State of one registration, as reported by [`MrCache::info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegInfo {
    /// Memory the registration is in.
    pub domain: MemDomain,
    /// First registered address.
    pub addr: u64,
    /// Registered length, bytes.
    pub len: u64,
    /// Outstanding references (acquires not yet released).
    pub refs: u32,
    /// Invalidated while in use: no lookup finds it; deregistered at its last release.
    pub stale: bool,
}

/// Errors of the registration cache; each names the range or registration involved.
#[derive(Debug, thiserror::Error)]
pub enum MrError {
    /// Zero length, or `addr + len` overflows the address space.
    #[error("invalid registration range: address {addr:#x} length {len} ({why})")]
    InvalidRange {
        /// Requested address.
        addr: u64,
        /// Requested length, bytes.
        len: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The request alone is larger than the whole budget.
    #[error("registration of {len} bytes at {addr:#x} exceeds the MR cache budget of {budget} bytes")]
    TooLarge {
        /// Requested address.
        addr: u64,
        /// Requested length, bytes.
        len: u64,
        /// Cache budget, bytes.
        budget: u64,
    },
    /// Even after evicting every unused registration the request would not fit.
    #[error(
        "MR cache budget of {budget} bytes cannot fit {len} bytes at {addr:#x}: {in_use} bytes are \
         held by registrations in use (evicting the {evictable} unused bytes is not enough)"
    )]
    OverBudget {
        /// Requested address.
        addr: u64,
        /// Requested length, bytes.
        len: u64,
        /// Cache budget, bytes.
        budget: u64,
        /// Bytes of registrations with references (not evictable).
        in_use: u64,
        /// Bytes of unused registrations (evictable).
        evictable: u64,
    },
    /// The registrar refused (for verbs: `ibv_reg_mr` failed).
    #[error("registering {len} bytes of {domain} at {addr:#x} failed: {source}")]
    Register {
        /// Memory of the request.
        domain: MemDomain,
        /// Requested address.
        addr: u64,
        /// Requested length, bytes.
        len: u64,
        /// The registrar's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Released more times than acquired (a double deregistration).
    #[error("{id} ({len} bytes at {addr:#x}) is not held: released more times than acquired")]
    NotHeld {
        /// The registration.
        id: RegId,
        /// Its address.
        addr: u64,
        /// Its length, bytes.
        len: u64,
    },
    /// No such registration: never issued, or already deregistered.
    #[error("unknown registration {id}: never issued or already deregistered")]
    Unknown {
        /// The id given.
        id: RegId,
    },
}
