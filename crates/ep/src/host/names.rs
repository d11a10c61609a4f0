//! Bootstrap errors in EP terms: the bootstrap has one member per process, and its messages
//! say "rank N" for member N; a job whose processes host several EP ranks each would read that
//! as EP rank N. [`process_names`] rewrites such a message to name the process and its EP ranks.

use std::ops::Range;

/// "process 2 (EP ranks 4, 5)", or "process 2" when its ranks are not known.
fn one(p: usize, ranks: &dyn Fn(usize) -> Option<Range<usize>>) -> String {
    match ranks(p) {
        Some(r) if r.len() == 1 => format!("process {p} (EP rank {})", r.start),
        Some(r) => format!("process {p} (EP ranks {})", list(r)),
        None => format!("process {p}"),
    }
}

fn list(r: impl Iterator<Item = usize>) -> String {
    r.map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// Rewrites a bootstrap error message `msg` (whose "rank N" and "ranks [a, b]" are bootstrap
/// members, i.e. processes) to say "process N (EP ranks ...)" and "processes [a, b] (EP ranks
/// ...)"; `ranks(p)` gives process p's EP ranks, `None` when unknown (then only "process N").
/// Apply it once, to a bootstrap error's own text.
pub fn process_names(msg: &str, ranks: &dyn Fn(usize) -> Option<Range<usize>>) -> String {
    let mut out = String::with_capacity(msg.len() + 32);
    let mut rest = msg;
    while let Some(at) = rest.find("rank") {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        // Whole words only ("rank", not "ranks" inside "EP ranks", not "frank").
        let word_start = head.chars().next_back().is_none_or(|c| !c.is_alphanumeric() && c != '_');
        if word_start {
            if let Some(t) = tail.strip_prefix("rank ") {
                let digits = t.bytes().take_while(u8::is_ascii_digit).count();
                if let Ok(p) = t[..digits].parse::<usize>() {
                    out.push_str(&one(p, ranks));
                    rest = &t[digits..];
                    continue;
                }
            }
            if let Some(t) = tail.strip_prefix("ranks [") {
                if let Some(end) = t.find(']') {
                    let ps: Option<Vec<usize>> =
                        t[..end].split(',').map(|x| x.trim()).filter(|x| !x.is_empty()).map(|x| x.parse().ok()).collect();
                    if let Some(ps) = ps {
                        out.push_str(&format!("processes [{}]", list(ps.iter().copied())));
                        let eps: Option<Vec<Range<usize>>> = ps.iter().map(|&p| ranks(p)).collect();
                        if let Some(eps) = eps.filter(|e| !e.is_empty()) {
                            out.push_str(&format!(" (EP ranks {})", list(eps.into_iter().flatten())));
                        }
                        rest = &t[end + 1..];
                        continue;
                    }
                }
            }
        }
        out.push_str("rank");
        rest = &tail[4..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::process_names;

    #[test]
    fn members_become_processes_with_their_ep_ranks() {
        let two = |p: usize| Some(p * 2..p * 2 + 2);
        assert_eq!(
            process_names("rank 2 was lost during barrier: reported by rank 0: connection reset", &two),
            "process 2 (EP ranks 4, 5) was lost during barrier: reported by process 0 (EP ranks 0, 1): connection reset"
        );
        assert_eq!(
            process_names("barrier timed out after 1.5 s waiting for ranks [1, 3]", &two),
            "barrier timed out after 1.5 s waiting for processes [1, 3] (EP ranks 2, 3, 6, 7)"
        );
        let single = |p: usize| Some(p..p + 1);
        assert_eq!(process_names("rank 3 aborted the group", &single), "process 3 (EP rank 3) aborted the group");
        assert_eq!(process_names("rank 1 says world size is 4", &|_| None), "process 1 says world size is 4");
        // Not members: other words, "rank" without a number, and text already rewritten.
        let s = "frank ranks: rank x; process 2 (EP ranks 4, 5)";
        assert_eq!(process_names(s, &two), s);
        assert_eq!(process_names("ranks [] and rank", &two), "processes [] and rank");
    }
}
