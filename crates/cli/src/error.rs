//! The one error type of the `mori` command, and its exit codes.

/// Exit status: the command ran and the answer is "yes" (backend usable, nothing flagged).
pub const EXIT_OK: i32 = 0;
/// Exit status: the command ran and the answer is "no" (the requested backend cannot work,
/// a pair was flagged, a group is worse than allowed), or what was asked for cannot be done
/// on this machine (no GPU runtime, a GPU call failed).
pub const EXIT_NO: i32 = 1;
/// Exit status: bad input (unparseable file, non-positive value, unknown index) or usage.
pub const EXIT_INPUT: i32 = 2;

/// Why a subcommand stopped. Printed as one line on stderr, never as a panic or a trace.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input is wrong (file contents, values, indices): exit [`EXIT_INPUT`].
    #[error("{0}")]
    Input(String),
    /// The command cannot do this here (no GPU runtime, a GPU call failed): exit [`EXIT_NO`].
    #[error("{0}")]
    Unavailable(String),
}

impl CliError {
    /// Shorthand for [`CliError::Input`].
    pub fn input(msg: impl Into<String>) -> Self {
        CliError::Input(msg.into())
    }

    /// The process exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Input(_) => EXIT_INPUT,
            CliError::Unavailable(_) => EXIT_NO,
        }
    }
}

/// Result of the command's modules.
pub type CliResult<T> = Result<T, CliError>;

/// Largest input file read, bytes (256 MiB): a topology capture or a trace is far smaller, and
/// an endless file (`/dev/zero`) must not hang the command.
pub const MAX_INPUT: u64 = 256 << 20;

/// Reads a whole input file (at most [`MAX_INPUT`] bytes), naming it in the error.
pub fn read_input(path: &std::path::Path) -> CliResult<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| CliError::input(format!("{}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    f.take(MAX_INPUT + 1).read_to_end(&mut bytes).map_err(|e| CliError::input(format!("{}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_INPUT {
        return Err(CliError::input(format!("{}: larger than {MAX_INPUT} bytes; not an input this command reads", path.display())));
    }
    String::from_utf8(bytes).map_err(|_| CliError::input(format!("{}: not UTF-8 text", path.display())))
}

/// `v` when `lo <= v <= hi` (and finite), else an input error naming `name`, the range and
/// `unit`. The models bound their inputs so that no result overflows to inf or NaN.
pub fn in_range(name: &str, v: f64, lo: f64, hi: f64, unit: &str) -> CliResult<f64> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        let shown = if v.is_finite() && (v == 0.0 || (1e-3..1e9).contains(&v.abs())) { format!("{v}") } else { format!("{v:e}") };
        let unit = if unit.is_empty() { String::new() } else { format!(" {unit}") };
        Err(CliError::input(format!("{name} must be in {lo:e}..={hi:e}{unit}, got {shown}")))
    }
}

/// `v` when `lo <= v <= hi`, else an input error naming `name` and the range (whole-number
/// inputs whose products the models must keep inside `u64` and finite `f64`).
pub fn int_in_range(name: &str, v: u64, lo: u64, hi: u64) -> CliResult<u64> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(CliError::input(format!("{name} must be in {lo}..={hi}, got {v}")))
    }
}

/// Checks that `v` is a finite number above zero, naming the flag in the error.
pub fn positive(name: &str, v: f64) -> CliResult<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(CliError::input(format!("{name} must be a positive number, got {v}")))
    }
}
