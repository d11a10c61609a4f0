//! What `mori check` says about the transfer engine's connection checks (`MORI_IO_AUTH`).

/// The line `mori check` prints for `MORI_IO_AUTH` as set in `vars` (the process
/// environment): on by default, a loud line when off, `INVALID` naming a bad value (engines
/// refuse to start then).
pub fn auth_line<'a>(mut vars: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    match vars.find(|(k, _)| *k == AUTH_ENV).map(|(_, v)| v) {
        None => "on: every connection must present the engine's secret (from its descriptor); MORI_IO_AUTH unset".into(),
        Some(v) => match mori_io_core::status::parse_switch(v) {
            Some(true) => format!("on: every connection must present the engine's secret (MORI_IO_AUTH={v})"),
            Some(false) => format!(
                "OFF (MORI_IO_AUTH={v}): any process that reaches an engine's port may read and write its registered memory; \
                 for benchmarks only"
            ),
            None => format!("INVALID: MORI_IO_AUTH={v:?} is not one of {} (engines refuse to start)", mori_io_core::status::SWITCH_VALUES),
        },
    }
}

/// The variable read by `mori_io::auth_from_env`.
pub const AUTH_ENV: &str = "MORI_IO_AUTH";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_is_reported_on_off_and_invalid() {
        let line = |v: &[(&'static str, &'static str)]| auth_line(v.iter().copied());
        assert!(line(&[]).starts_with("on: every connection must present"), "{}", line(&[]));
        assert!(line(&[("MORI_IO_AUTH", "1")]).starts_with("on:"));
        assert!(line(&[("MORI_IO_AUTH", "off")]).starts_with("OFF (MORI_IO_AUTH=off): any process"));
        assert!(line(&[("MORI_IO_AUTH", "maybe")]).starts_with("INVALID: MORI_IO_AUTH=\"maybe\" is not one of"));
        assert!(line(&[("MORI_IO_TC", "3")]).starts_with("on:"));
    }
}
