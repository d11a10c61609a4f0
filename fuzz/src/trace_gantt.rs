//! `trace_gantt`: the Gantt timeline PNG `mori trace analyze` draws by default
//! ([`mori_cli::gantt::draw`]) from a trace that parses and analyzes (the checks of
//! [`crate::trace_analyze`] included), written to a file in the temporary directory.
//!
//! Asserted: drawing returns (a PNG, or an error such as the refusal of an infinite time
//! extent) within libFuzzer's timeout, without panicking. Slow (tens of milliseconds an input):
//! the seeds hold one or two iterations.

/// One input.
pub fn run(data: &[u8]) {
    let Some(a) = crate::trace_analyze::analysis(data) else { return };
    let path = std::env::temp_dir().join(format!("mori-fuzz-gantt-{}.png", std::process::id()));
    let _ = mori_cli::gantt::draw(&a, &path, "fuzz");
    let _ = std::fs::remove_file(&path);
}

/// The traces of `trace_analyze`, and one whose extent is infinite.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut v = crate::trace_analyze::seeds();
    v.push(
        br#"[{"name":"ep_dispatch_copy_to_staging","ph":"B","ts":-1e308,"tid":1},{"name":"ep_dispatch_copy_to_staging","ph":"E","ts":1e308,"tid":1}]"#
            .to_vec(),
    );
    v
}

/// As `trace_analyze`.
pub fn dict() -> Vec<&'static str> {
    crate::trace_analyze::dict()
}
