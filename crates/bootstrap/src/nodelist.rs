//! First host of a Slurm compressed host list (`gpu-[01-04,07],login1` -> `gpu-01`).

/// Returns the first host name of a Slurm host list such as `SLURM_JOB_NODELIST`.
///
/// Accepts plain lists (`a,b`), bracket ranges with zero padding kept as written
/// (`gpu-[01-04,07]`), several bracket groups in one name (`r[1-2]-n[3,5]` -> `r1-n3`) and
/// whitespace around items. The error string describes what is malformed.
pub fn first_host(list: &str) -> Result<String, String> {
    let list = list.trim();
    // The first item ends at the first comma outside brackets.
    let mut depth = 0i32;
    let mut end = list.len();
    for (i, ch) in list.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced or nested brackets in host list {list:?}"));
        }
    }
    let item = list[..end].trim();
    if item.is_empty() {
        return Err(format!("host list {list:?} has an empty first entry"));
    }
    let mut host = String::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find(']').ok_or_else(|| format!("unclosed '[' in host list entry {item:?}"))?;
        let ranges = &after[..close];
        let first = ranges.split([',', '-']).next().unwrap_or("").trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad range [{ranges}] in host list entry {item:?}"));
        }
        for part in ranges.split(',') {
            let ok = part.split('-').count() <= 2
                && part.split('-').all(|n| !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit()));
            if !ok {
                return Err(format!("bad range [{ranges}] in host list entry {item:?}"));
            }
        }
        host.push_str(first);
        rest = &after[close + 1..];
    }
    if rest.contains(']') {
        return Err(format!("stray ']' in host list entry {item:?}"));
    }
    host.push_str(rest);
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::first_host;

    #[test]
    fn slurm_forms() {
        assert_eq!(first_host("gpu-[01-04,07],login1").unwrap(), "gpu-01");
        assert_eq!(first_host("node17").unwrap(), "node17");
        assert_eq!(first_host("alpha,beta").unwrap(), "alpha");
        assert_eq!(first_host(" n[3,1-2] ").unwrap(), "n3");
        assert_eq!(first_host("rack[1-2]-node[008-010]").unwrap(), "rack1-node008");
        assert_eq!(first_host("login1,gpu-[01-04]").unwrap(), "login1");
        assert_eq!(first_host("a[0]b").unwrap(), "a0b");
        assert_eq!(first_host("host.example.com").unwrap(), "host.example.com");
    }

    #[test]
    fn malformed_lists() {
        for bad in ["", ",a", "gpu-[01-04", "gpu-]01[", "gpu-[a-b]", "gpu-[]", "gpu-[1-2-3]", "x[[1]]", "gpu-[1,]"] {
            assert!(first_host(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
