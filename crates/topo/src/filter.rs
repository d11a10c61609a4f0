//! `MORI_RDMA_DEVICES`: which RDMA devices the backend may use.

use crate::{TopoError, Topology};

/// The environment variable that pins RDMA devices (the MORI-IO guide: override the automatic,
/// rail/NUMA-aware choice only after checking the topology).
pub const RDMA_DEVICES_ENV: &str = "MORI_RDMA_DEVICES";

/// A parsed `MORI_RDMA_DEVICES` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceFilter {
    /// `a,b`: only these devices (each must exist).
    Include(Vec<String>),
    /// `^a,b`: every device but these.
    Exclude(Vec<String>),
}

impl DeviceFilter {
    /// Parses a comma list of device names, or `^` and a comma list to exclude. Blanks around
    /// names are ignored, duplicates dropped; an empty or blank value means no filter
    /// (`Ok(None)`).
    ///
    /// Errors: [`TopoError::BadDeviceList`] for an empty name (`a,,b`, `^`), a name with
    /// blanks or `/`, or a `name:port` suffix (ports are not selectable here).
    pub fn parse(value: &str) -> Result<Option<DeviceFilter>, TopoError> {
        let bad = |why: String| TopoError::BadDeviceList { value: value.to_string(), why };
        let v = value.trim();
        if v.is_empty() {
            return Ok(None);
        }
        let (exclude, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut names: Vec<String> = Vec::new();
        for (i, raw) in list.split(',').enumerate() {
            let name = raw.trim();
            if name.is_empty() {
                return Err(bad(format!("device name {} is empty", i + 1)));
            }
            if name.contains(':') {
                return Err(bad(format!("{name:?}: port suffixes are not supported, list device names (mlx5_0)")));
            }
            if name.chars().any(|c| c.is_whitespace() || c == '/' || c == '^') {
                return Err(bad(format!("{name:?} is not a device name")));
            }
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        Ok(Some(if exclude { DeviceFilter::Exclude(names) } else { DeviceFilter::Include(names) }))
    }

    /// Reads and parses [`RDMA_DEVICES_ENV`]; unset means no filter. Errors: as
    /// [`DeviceFilter::parse`].
    pub fn from_env() -> Result<Option<DeviceFilter>, TopoError> {
        match std::env::var(RDMA_DEVICES_ENV) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(TopoError::BadDeviceList { value: v.to_string_lossy().into_owned(), why: "not valid UTF-8".to_string() })
            }
        }
    }

    /// Whether device `name` passes the filter.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            DeviceFilter::Include(v) => v.iter().any(|n| n == name),
            DeviceFilter::Exclude(v) => !v.iter().any(|n| n == name),
        }
    }
}

/// Indices into [`Topology::nics`] of the NICs selection may use: an active port and
/// passing `filter` (`None`: all). Errors: [`TopoError::UnknownDevice`] when an include list
/// names a device this node does not have (naming the devices it has).
pub fn allowed_nics(topo: &Topology, filter: Option<&DeviceFilter>) -> Result<Vec<usize>, TopoError> {
    if let Some(DeviceFilter::Include(names)) = filter {
        if let Some(missing) = names.iter().find(|n| topo.nic_index(n).is_none()) {
            let present: Vec<&str> = topo.nics.iter().map(|n| n.name.as_str()).collect();
            let present = if present.is_empty() { "none".to_string() } else { present.join(", ") };
            return Err(TopoError::UnknownDevice { name: missing.clone(), present });
        }
    }
    let ok = |name: &str| filter.is_none_or(|f| f.allows(name));
    Ok((0..topo.nics.len()).filter(|&i| topo.nics[i].is_active() && ok(&topo.nics[i].name)).collect())
}
