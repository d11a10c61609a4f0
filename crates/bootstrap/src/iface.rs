//! Choice of the local IPv4 address for the ring listener (`getifaddrs(3)`).

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::ENV_IFNAME;
use crate::error::BootstrapError;

/// One IPv4 address of a local interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// `IFF_UP` is set.
    pub up: bool,
    /// `IFF_LOOPBACK` is set.
    pub loopback: bool,
}

/// Lists the IPv4 addresses of all local interfaces, in `getifaddrs` order.
///
/// # Errors
/// [`BootstrapError::Io`] when `getifaddrs` fails.
pub fn ipv4_interfaces() -> Result<Vec<InterfaceAddr>, BootstrapError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success it receives a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(BootstrapError::io("getifaddrs", io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list returned by getifaddrs, alive until
        // freeifaddrs below; we only read it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr whose family field is valid.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: for AF_INET entries `ifa_addr` points to a `sockaddr_in`.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: `ifa_name` is a non-null NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let flags = ifa.ifa_flags;
        out.push(InterfaceAddr {
            name,
            ip,
            up: flags & libc::IFF_UP as libc::c_uint != 0,
            loopback: flags & libc::IFF_LOOPBACK as libc::c_uint != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP a non-root rank binds its ring listener on:
/// 1. `ifname` (config), else `MORI_SOCKET_IFNAME`: that interface's first IPv4 address;
/// 2. else, when the master is loopback, `127.0.0.1` (`::1` for an IPv6 master);
/// 3. else the first non-loopback IPv4 address of an interface that is up.
///
/// # Errors
/// [`BootstrapError::InvalidConfig`] naming the interface when it has no IPv4 address, or
/// saying that no usable interface exists.
pub fn choose_local_ip(ifname: Option<&str>, master: &SocketAddr) -> Result<IpAddr, BootstrapError> {
    let env = std::env::var(ENV_IFNAME).ok().filter(|v| !v.trim().is_empty());
    let (name, source) = match (ifname, env.as_deref()) {
        (Some(n), _) => (Some(n.trim()), "SocketBootstrapConfig::ifname"),
        (None, Some(n)) => (Some(n.trim()), ENV_IFNAME),
        (None, None) => (None, ""),
    };
    pick(name, source, master, &ipv4_interfaces()?)
}

/// Pure part of [`choose_local_ip`].
pub(crate) fn pick(name: Option<&str>, source: &str, master: &SocketAddr, ifs: &[InterfaceAddr]) -> Result<IpAddr, BootstrapError> {
    if let Some(name) = name {
        return match ifs.iter().find(|i| i.name == name) {
            Some(i) => Ok(IpAddr::V4(i.ip)),
            None => {
                let known: Vec<&str> = ifs.iter().map(|i| i.name.as_str()).collect();
                Err(BootstrapError::InvalidConfig(format!("{source}={name:?}: no such interface with an IPv4 address (have {known:?})")))
            }
        };
    }
    if master.ip().is_loopback() {
        return Ok(match master.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    ifs.iter().find(|i| i.up && !i.loopback).map(|i| IpAddr::V4(i.ip)).ok_or_else(|| {
        BootstrapError::InvalidConfig(format!("no non-loopback IPv4 interface is up to reach master {master}; set {ENV_IFNAME}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs() -> Vec<InterfaceAddr> {
        let mk = |name: &str, ip: [u8; 4], up, loopback| InterfaceAddr { name: name.into(), ip: ip.into(), up, loopback };
        vec![mk("lo", [127, 0, 0, 1], true, true), mk("eth9", [10, 9, 9, 9], false, false), mk("ens1", [10, 0, 0, 2], true, false)]
    }

    #[test]
    fn choice_order() {
        let remote: SocketAddr = "10.0.0.1:18515".parse().unwrap();
        let lo: SocketAddr = "127.0.0.5:18515".parse().unwrap();
        assert_eq!(pick(None, "", &remote, &ifs()).unwrap(), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(pick(None, "", &lo, &ifs()).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick(Some("eth9"), "x", &lo, &ifs()).unwrap(), "10.9.9.9".parse::<IpAddr>().unwrap());
        let e = pick(Some("ib0"), ENV_IFNAME, &remote, &ifs()).unwrap_err().to_string();
        assert!(e.contains("MORI_SOCKET_IFNAME=\"ib0\""), "{e}");
        let e = pick(None, "", &remote, &ifs()[..2]).unwrap_err().to_string();
        assert!(e.contains("no non-loopback IPv4 interface"), "{e}");
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let all = ipv4_interfaces().unwrap();
        assert!(all.iter().any(|i| i.loopback && i.ip == Ipv4Addr::LOCALHOST), "{all:?}");
    }
}
