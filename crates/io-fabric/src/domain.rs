//! Fabric domains: which engines can share memory through a given handle type.
//!
//! POSIX-FD handles work between processes of one node that can reach each other's Unix
//! sockets: same kernel boot (`/proc/sys/kernel/random/boot_id`) and same network namespace
//! (the sockets are abstract). FABRIC handles work across one scale-up domain: on NVIDIA the
//! NVLink cluster UUID and clique id (`nvidia-smi -q`, section "Fabric"), given to this build
//! through `MORI_FABRIC_DOMAIN=<cluster uuid>:<clique id>`. The rules are pure ([`check`]).

use mori_io_core::{IoError, IoResult};
use serde::{Deserialize, Serialize};

/// Environment variable naming this process's FABRIC domain, `<cluster uuid>:<clique id>`.
pub const DOMAIN_ENV: &str = "MORI_FABRIC_DOMAIN";

/// The shareable-handle type a fabric backend exports and imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HandleType {
    /// POSIX file descriptor, passed over a Unix socket (one node).
    PosixFd,
    /// FABRIC handle bytes (a scale-up domain; CUDA needs an IMEX channel).
    Fabric,
}

impl HandleType {
    /// Parses `posix-fd` / `posix_fd` / `fd` or `fabric` (case-insensitive).
    /// Errors: `InvalidArgs` naming the value and the accepted spellings.
    pub fn parse(s: &str) -> IoResult<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "posix-fd" | "posix_fd" | "fd" => Ok(HandleType::PosixFd),
            "fabric" => Ok(HandleType::Fabric),
            other => Err(IoError::invalid(format!("fabric handle type {other:?}: expected posix-fd or fabric"))),
        }
    }

    /// The mori-gpu kind.
    pub fn shareable(self) -> mori_gpu::ShareableKind {
        match self {
            HandleType::PosixFd => mori_gpu::ShareableKind::PosixFd,
            HandleType::Fabric => mori_gpu::ShareableKind::Fabric,
        }
    }
}

impl std::fmt::Display for HandleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HandleType::PosixFd => "POSIX_FD",
            HandleType::Fabric => "FABRIC",
        })
    }
}

/// Where an engine's handles can be imported.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FabricDomain {
    /// One node (POSIX-FD handles).
    Node {
        /// Kernel boot id (equal for every process of one booted machine).
        boot_id: String,
        /// Network namespace (`net:[inode]`): abstract Unix sockets are per namespace.
        netns: String,
        /// Host name, for messages.
        hostname: String,
    },
    /// One scale-up fabric domain (FABRIC handles).
    Fabric {
        /// NVLink cluster UUID (or the vendor's equivalent, e.g. the UALink vPOD).
        cluster: String,
        /// Clique id inside the cluster.
        clique: u32,
    },
}

impl FabricDomain {
    /// The handle type this domain belongs to.
    pub fn handle_type(&self) -> HandleType {
        match self {
            FabricDomain::Node { .. } => HandleType::PosixFd,
            FabricDomain::Fabric { .. } => HandleType::Fabric,
        }
    }

    /// This process's node domain from procfs. Errors: `NotSupported` when the boot id or
    /// network namespace cannot be read (not Linux).
    pub fn this_node(hostname: &str) -> IoResult<Self> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map_err(|e| IoError::not_supported(format!("fabric POSIX-FD domain: read /proc/sys/kernel/random/boot_id: {e}")))?
            .trim()
            .to_string();
        let netns = std::fs::read_link("/proc/self/ns/net")
            .map_err(|e| IoError::not_supported(format!("fabric POSIX-FD domain: read /proc/self/ns/net: {e}")))?
            .to_string_lossy()
            .into_owned();
        Ok(FabricDomain::Node { boot_id, netns, hostname: hostname.to_string() })
    }

    /// Parses a FABRIC domain `<cluster uuid>:<clique id>` (as in [`DOMAIN_ENV`]).
    /// Errors: `InvalidArgs` naming the value when the cluster is empty or the clique id is not
    /// a 32-bit number.
    pub fn parse_fabric(s: &str) -> IoResult<Self> {
        let bad = |why: &str| IoError::invalid(format!("{DOMAIN_ENV}={s:?}: {why}; expected <cluster uuid>:<clique id>"));
        let (cluster, clique) = s.trim().rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
        if cluster.is_empty() {
            return Err(bad("empty cluster uuid"));
        }
        let clique = clique.parse::<u32>().map_err(|_| bad("clique id is not a number up to 4294967295"))?;
        Ok(FabricDomain::Fabric { cluster: cluster.to_ascii_lowercase(), clique })
    }
}

impl std::fmt::Display for FabricDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FabricDomain::Node { boot_id, netns, hostname } => write!(f, "node {hostname} (boot id {boot_id}, {netns})"),
            FabricDomain::Fabric { cluster, clique } => write!(f, "fabric cluster {cluster} clique {clique}"),
        }
    }
}

/// Whether handles exported in domain `remote` can be imported in domain `local`; the error
/// says why not, in words a user can act on.
pub fn check(local: &FabricDomain, remote: &FabricDomain) -> Result<(), String> {
    use FabricDomain::*;
    match (local, remote) {
        (Node { boot_id: b1, netns: n1, .. }, Node { boot_id: b2, netns: n2, hostname: h2 }) => {
            if b1 != b2 {
                Err(format!(
                    "the remote engine is on another node ({h2}, boot id {b2}); POSIX-FD handles work within one node, use FABRIC handles across a scale-up domain"
                ))
            } else if n1 != n2 {
                Err(format!(
                    "the remote engine is on this node but in another network namespace ({n2} vs {n1}): the Unix socket that passes POSIX-FD handles cannot be reached"
                ))
            } else {
                Ok(())
            }
        }
        (Fabric { cluster: c1, clique: q1 }, Fabric { cluster: c2, clique: q2 }) => {
            if c1 != c2 || q1 != q2 {
                Err(format!(
                    "the remote engine is in another fabric domain (cluster {c2} clique {q2}; this engine: cluster {c1} clique {q1})"
                ))
            } else {
                Ok(())
            }
        }
        _ => Err(format!(
            "handle types differ: this engine uses {} handles, the remote {}; both must use the same (MORI_IO_FABRIC_HANDLE)",
            local.handle_type(),
            remote.handle_type()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(b: &str, n: &str) -> FabricDomain {
        FabricDomain::Node { boot_id: b.into(), netns: n.into(), hostname: format!("host-{b}") }
    }

    #[test]
    fn node_rules() {
        assert_eq!(check(&node("a", "net:[1]"), &node("a", "net:[1]")), Ok(()));
        let e = check(&node("a", "net:[1]"), &node("b", "net:[1]")).unwrap_err();
        assert!(e.contains("another node (host-b, boot id b)"), "{e}");
        let e = check(&node("a", "net:[1]"), &node("a", "net:[2]")).unwrap_err();
        assert!(e.contains("another network namespace (net:[2] vs net:[1])"), "{e}");
    }

    #[test]
    fn fabric_rules_and_parsing() {
        let d = FabricDomain::parse_fabric("5C1E2B3A-0000-4000-8000-000000000001:7").unwrap();
        assert_eq!(d, FabricDomain::Fabric { cluster: "5c1e2b3a-0000-4000-8000-000000000001".into(), clique: 7 });
        let other = FabricDomain::Fabric { cluster: "5c1e2b3a-0000-4000-8000-000000000001".into(), clique: 8 };
        assert_eq!(check(&d, &d.clone()), Ok(()));
        let e = check(&d, &other).unwrap_err();
        assert!(e.contains("clique 8") && e.contains("clique 7"), "{e}");
        let e = check(&d, &node("a", "n")).unwrap_err();
        assert!(e.contains("this engine uses FABRIC handles, the remote POSIX_FD"), "{e}");
        for bad in ["", "uuid", ":3", "uuid:x", "uuid:4294967296"] {
            let e = FabricDomain::parse_fabric(bad).unwrap_err();
            assert!(e.msg.contains(DOMAIN_ENV), "{bad}: {e}");
        }
    }

    #[test]
    fn this_node_reads_procfs() {
        let d = FabricDomain::this_node("h").unwrap();
        let FabricDomain::Node { boot_id, netns, .. } = &d else { panic!("{d:?}") };
        assert_eq!(boot_id.len(), 36, "boot id {boot_id:?}");
        assert!(netns.starts_with("net:["), "{netns}");
        assert_eq!(check(&d, &FabricDomain::this_node("h").unwrap()), Ok(()));
    }

    #[test]
    fn handle_type_parse() {
        assert_eq!(HandleType::parse("POSIX-FD").unwrap(), HandleType::PosixFd);
        assert_eq!(HandleType::parse("fabric").unwrap(), HandleType::Fabric);
        assert!(HandleType::parse("ipc").unwrap_err().msg.contains("expected posix-fd or fabric"));
    }
}
