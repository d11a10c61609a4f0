//! Host addresses as the whole stack reads them: one parser for the bootstrap master, the
//! address an engine advertises and the address a peer dials.
//!
//! - IPv6 literals may be written bare (`::1`) or bracketed (`[::1]`), as in a URL.
//! - Every spelling of an unspecified address (`0.0.0.0`, `0`, `::`, `::0`,
//!   `0:0:0:0:0:0:0:0`, `::ffff:0.0.0.0`, ...) is recognised after resolution, not by its text.
//! - A host *name* that resolves to loopback (Debian maps its own hostname to 127.0.1.1) is
//!   told apart from a loopback literal or `localhost`: a rank on another host resolves the
//!   same name to *its* loopback, so such a name cannot serve two hosts.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// `host` without one pair of enclosing brackets (`[::1]` -> `::1`); anything else unchanged.
pub fn unbracket(host: &str) -> &str {
    let h = host.trim();
    h.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(h)
}

/// `host` as an IP literal (brackets allowed), or `None` for a name.
pub fn literal(host: &str) -> Option<IpAddr> {
    unbracket(host).parse().ok()
}

/// Resolves `host` (a name, or an IP literal, bracketed or not) with `port`, IPv4 first, each
/// address once. Errors: resolution's own, or `NotFound` when it yields nothing.
pub fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let h = unbracket(host);
    let mut v: Vec<SocketAddr> = match h.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (h, port).to_socket_addrs()?.collect(),
    };
    v.sort_by_key(|a| a.is_ipv6());
    v.dedup();
    if v.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{host:?} resolves to no address")));
    }
    Ok(v)
}

/// True for an unspecified address in any form, IPv4-mapped included (`::ffff:0.0.0.0`).
pub fn is_unspecified(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified()),
    }
}

/// True for a loopback address in any form, IPv4-mapped included (`::ffff:127.0.0.1`).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// The address `host` (given as `what`, e.g. `--self-ip` or `engine host`) resolves to, when
/// it is an address peers can dial: refuses any unspecified address, naming the resolution.
/// Errors: resolution failures and wildcards, as `InvalidInput` with the reason.
pub fn advertised(what: &str, host: &str, port: u16) -> io::Result<SocketAddr> {
    let addrs = resolve(host, port).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} {host:?}: {e}")))?;
    refuse_wildcard(what, host, &addrs)?;
    Ok(addrs[0])
}

/// `InvalidInput` naming `what` and `host` when any of `resolved` (what `host` resolved to)
/// is an unspecified address: peers dialling it would reach their own host.
pub fn refuse_wildcard(what: &str, host: &str, resolved: &[SocketAddr]) -> io::Result<()> {
    if let Some(a) = resolved.iter().find(|a| is_unspecified(a.ip())) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{what} {host:?} is a wildcard ({}): it becomes the address peers dial, so they would dial their own loopback and get \
                 'connection refused'; give an address the peer can reach",
                a.ip()
            ),
        ));
    }
    Ok(())
}

/// When `host` is a name other than `localhost` that resolves only to loopback addresses:
/// those addresses (a rank on another host would resolve the name to its own loopback).
/// `None` for literals, `localhost`, and names with a non-loopback address.
pub fn loopback_name(host: &str, resolved: &[SocketAddr]) -> Option<Vec<IpAddr>> {
    let h = unbracket(host);
    let lower = h.to_ascii_lowercase();
    if literal(h).is_some() || lower == "localhost" || lower.ends_with(".localhost") || lower == "localhost.localdomain" {
        return None;
    }
    let ips: Vec<IpAddr> = resolved.iter().map(SocketAddr::ip).collect();
    (!ips.is_empty() && ips.iter().all(|ip| is_loopback(*ip))).then_some(ips)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn brackets_are_accepted_around_ipv6_literals() {
        assert_eq!(unbracket("[::1]"), "::1");
        assert_eq!(unbracket(" [fe80::1] "), "fe80::1");
        assert_eq!(unbracket("10.0.0.1"), "10.0.0.1");
        assert_eq!(resolve("[::1]", 7).unwrap(), vec![SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 7)]);
        assert_eq!(resolve("::1", 7).unwrap(), resolve("[::1]", 7).unwrap());
        assert_eq!(literal("[::1]"), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(literal("example.invalid"), None);
    }

    #[test]
    fn every_spelling_of_a_wildcard_is_refused() {
        for w in ["0.0.0.0", "0", "::", "[::]", "::0", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0", "[::ffff:0.0.0.0]"] {
            let e = advertised("--self-ip", w, 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{w}");
            assert!(e.to_string().contains("wildcard"), "{w}: {e}");
        }
        assert_eq!(advertised("--self-ip", "127.0.0.1", 9).unwrap(), SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9));
        assert!(advertised("--self-ip", "[::1]", 9).unwrap().is_ipv6());
    }

    #[test]
    fn a_name_resolving_to_loopback_is_told_apart() {
        let lo = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(loopback_name("myhost", &[lo("127.0.1.1:1")]), Some(vec!["127.0.1.1".parse().unwrap()]));
        assert_eq!(loopback_name("myhost", &[lo("127.0.1.1:1"), lo("10.0.0.2:1")]), None);
        assert_eq!(loopback_name("localhost", &[lo("127.0.0.1:1")]), None);
        assert_eq!(loopback_name("127.0.0.1", &[lo("127.0.0.1:1")]), None);
        assert_eq!(loopback_name("[::1]", &[lo("[::1]:1")]), None);
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
    }
}
