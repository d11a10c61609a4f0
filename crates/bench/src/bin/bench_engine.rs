//! bench_engine: see `mori_bench` and `bench_engine --help`.

use clap::Parser;
use mori_bench::args::Args;
use mori_bench::report;
use mori_bench::run::{run, run_single_process, Failure};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable through which `--local` tells its child to be rank 1 on a port.
const CHILD_ENV: &str = "MORI_BENCH_LOCAL_CHILD_PORT";
const DEFAULT_PORT: u16 = 18515;

fn init_logging(level: &str) -> Result<(), String> {
    let lvl = match level {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" => "error",
        other => return Err(format!("--log-level {other:?}: use trace, debug, info, warning, error or critical")),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MORI_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("warn,mori_io={lvl},mori_io_tcp={lvl},mori_bootstrap={lvl}")));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    Ok(())
}

/// Three consecutive free TCP ports on loopback (bootstrap, engine 0, engine 1).
fn free_port_range() -> Option<u16> {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    for k in 0..200u64 {
        let base = 20000 + ((seed.wrapping_mul(2654435761).wrapping_add(k * 7919)) % 40000) as u16;
        let ok = (0..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if ok {
            return Some(base);
        }
    }
    None
}

fn spawn_target(port: u16) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("--local: cannot find own executable: {e}"))?;
    Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ENV, port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("--local: cannot start the target rank: {e}"))
}

/// Watches the `--local` target: if it exits with an error before rank 0 is done, there is no
/// point in waiting for it at the rendezvous: say so and stop. After `done` is set, waits for
/// its exit (20 s, or 0.5 s when rank 0 failed) and returns its status (`None`: killed).
fn watch(mut child: Child, done: Arc<AtomicU8>) -> Option<i32> {
    loop {
        match child.try_wait() {
            Ok(Some(st)) if done.load(Ordering::Acquire) == 0 && !st.success() => {
                eprintln!("error: the target rank (rank 1) exited with {st} before the run finished; its message is above");
                std::process::exit(1);
            }
            Ok(Some(st)) if done.load(Ordering::Acquire) != 0 => return st.code(),
            Ok(_) if done.load(Ordering::Acquire) != 0 => break,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let failed = done.load(Ordering::Acquire) == 2;
    let deadline = Instant::now() + if failed { Duration::from_millis(500) } else { Duration::from_secs(20) };
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st.code(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    let child_port = std::env::var(CHILD_ENV).ok().and_then(|p| p.parse::<u16>().ok());
    if let Err(e) = init_logging(&args.log_level) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // Writable outputs are checked before the run, not after it.
    for (flag, path) in [("--json", &args.json), ("--plot", &args.plot)] {
        if let Some(p) = path {
            if args.rank == 0 && child_port.is_none() {
                if let Err(e) = std::fs::OpenOptions::new().create(true).append(true).open(p) {
                    eprintln!("error: {flag} {}: {e}", p.display());
                    return ExitCode::from(2);
                }
            }
        }
    }
    let done = Arc::new(AtomicU8::new(0));
    let mut child: Option<std::thread::JoinHandle<Option<i32>>> = None;
    let port;
    if args.local {
        if args.rank != 0 && child_port.is_none() {
            eprintln!("error: --local starts rank 1 itself; do not pass --rank {}", args.rank);
            return ExitCode::from(2);
        }
        let lo = args.master_ip == "127.0.0.1" || args.master_ip == "localhost";
        if !lo || args.self_ip.as_deref().is_some_and(|s| s != "127.0.0.1") {
            eprintln!("error: --local runs both ranks on loopback; drop --master-ip/--self-ip (or run the two ranks by hand)");
            return ExitCode::from(2);
        }
        if let Some(p) = child_port {
            args.rank = 1;
            port = p;
        } else {
            port = match args.port.or_else(free_port_range) {
                Some(p) => p,
                None => {
                    eprintln!("error: --local: found no three consecutive free ports; pass --port");
                    return ExitCode::from(2);
                }
            };
            match spawn_target(port) {
                Ok(c) => {
                    let d = done.clone();
                    child = Some(std::thread::spawn(move || watch(c, d)));
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    } else {
        port = args.port.unwrap_or(DEFAULT_PORT);
    }
    let ranks_here = if args.local { 2 } else { 1 };
    let r = if args.xgmi_single_process { run_single_process(&args) } else { run(&args, port, ranks_here) };
    done.store(if r.is_err() { 2 } else { 1 }, Ordering::Release);
    let child_code = child.map(|h| h.join().unwrap_or(None));
    match r {
        Err(Failure { msg, code }) => {
            eprintln!("error (rank {}): {msg}", args.rank);
            ExitCode::from(code as u8)
        }
        Ok(out) => {
            if args.rank != 0 {
                return ExitCode::SUCCESS;
            }
            println!("{}", report::table(&out.rows));
            println!("validation: {}", out.validation);
            let mut code = if out.validation.starts_with("FAILED") { 1 } else { 0 };
            if let Some(p) = &args.json {
                if let Err(e) = report::write_json(p, &args.workload(), &out.validation, &out.rows) {
                    eprintln!("error: {e}");
                    code = 1;
                }
            }
            if let Some(p) = &args.plot {
                let title = format!(
                    "bench_engine {} {}, {} connection(s)/QP(s)",
                    format!("{:?}", args.op).to_lowercase(),
                    format!("{:?}", args.backend).to_lowercase(),
                    args.num_qp_per_transfer
                );
                if let Err(e) = report::plot(p, &out.rows, args.all_batch, &title) {
                    eprintln!("error: {e}");
                    code = 1;
                }
            }
            if let Some(Some(c)) = child_code {
                if c != 0 {
                    eprintln!("error: the target rank exited with status {c}");
                    code = 1;
                }
            } else if let Some(None) = child_code {
                eprintln!("error: the target rank did not exit in time and was killed");
                code = 1;
            }
            ExitCode::from(code)
        }
    }
}
