//! bench_engine: see `mori_bench` and `bench_engine --help`.

use clap::Parser;
use mori_bench::args::{Args, MemArg};
use mori_bench::local::{self, RunToken};
use mori_bench::report;
use mori_bench::run::{run, run_single_process, Failure, Outcome};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming a started process's side and index: `<rank>:<index>`.
const INDEX_ENV: &str = "MORI_BENCH_CHILD";
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

/// Starts this executable again, with the same arguments, as process `index` of side `rank`
/// (with `--local`, also told the bootstrap port, the run token and this process's pid). Its
/// stdout is dropped (only global rank 0 prints the table); its stderr is ours.
fn spawn_rank(rank: usize, index: u32, local_run: Option<(u16, RunToken)>) -> Result<(String, Child), String> {
    let name = format!("{} {index} (rank {rank})", if rank == 0 { "initiator" } else { "target" });
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable to start {name}: {e}"))?;
    let mut c = Command::new(exe);
    c.args(std::env::args_os().skip(1)).env(INDEX_ENV, format!("{rank}:{index}"));
    if let Some((p, token)) = local_run {
        c.env(local::PORT_ENV, p.to_string())
            .env(local::TOKEN_ENV, token.to_string())
            .env(local::PARENT_ENV, std::process::id().to_string());
    }
    let child =
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok((name, child))
}

/// Watches the processes this one started: if one exits with an error before this process is
/// done, there is no point in waiting for it at the rendezvous: say which, kill the others and
/// stop. After `done` is set, waits for each exit (20 s in all, or 0.5 s when this process
/// failed) and returns their statuses (`None`: killed).
fn watch(mut children: Vec<(String, Child)>, done: Arc<AtomicU8>) -> Vec<(String, Option<i32>)> {
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    while done.load(Ordering::Acquire) == 0 {
        for (k, (name, c)) in children.iter_mut().enumerate() {
            if codes[k].is_some() {
                continue;
            }
            if let Ok(Some(st)) = c.try_wait() {
                if !st.success() && done.load(Ordering::Acquire) == 0 {
                    eprintln!("error: {name} exited with {st} before the run finished; its message is above");
                    for (_, o) in children.iter_mut() {
                        let _ = o.kill();
                        let _ = o.wait();
                    }
                    std::process::exit(1);
                }
                codes[k] = Some(st.code());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let failed = done.load(Ordering::Acquire) == 2;
    let deadline = Instant::now() + if failed { Duration::from_millis(500) } else { Duration::from_secs(20) };
    children
        .into_iter()
        .zip(codes)
        .map(|((name, mut c), code)| {
            if let Some(code) = code {
                return (name, code);
            }
            loop {
                match c.try_wait() {
                    Ok(Some(st)) => return (name, st.code()),
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        return (name, None);
                    }
                }
            }
        })
        .collect()
}

/// `<rank>:<index>` from [`INDEX_ENV`], checked against the flags.
fn child_identity(args: &Args) -> Result<Option<(usize, u32)>, String> {
    let Ok(v) = std::env::var(INDEX_ENV) else { return Ok(None) };
    let parsed = v.split_once(':').and_then(|(r, i)| Some((r.parse::<usize>().ok()?, i.parse::<u32>().ok()?)));
    match parsed {
        Some((r, i)) if r <= 1 && i < args.pairs() => Ok(Some((r, i))),
        _ => Err(format!("{INDEX_ENV}={v:?}: expected <rank 0|1>:<index below --num-initiator-dev {}>", args.pairs())),
    }
}

/// A `--local` child's port and token from its parent's environment, after asking to die with
/// the parent. Errors name the variable.
fn local_child() -> Result<(u16, RunToken), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{INDEX_ENV} is set with --local but {k} is not"));
    let port = var(local::PORT_ENV)?;
    let port =
        port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("{}={port:?}: expected a port 1..=65535", local::PORT_ENV))?;
    let token = RunToken::parse(&var(local::TOKEN_ENV)?)?;
    let parent = var(local::PARENT_ENV)?;
    let parent = parent.parse::<u32>().map_err(|_| format!("{}={parent:?}: expected a pid", local::PARENT_ENV))?;
    local::die_with_parent(parent)?;
    Ok((port, token))
}

/// With GPU memory and several pairs: every GPU the pairs use must exist (checked here, before
/// any process is started).
fn check_gpus(args: &Args) -> Result<(), String> {
    if args.mem_type != MemArg::Gpu || args.pairs() == 1 {
        return Ok(());
    }
    let rt = mori_gpu::detect().map_err(|e| format!("--mem-type gpu: {e}"))?;
    let count = rt.device_count().map_err(|e| format!("--mem-type gpu: {e}"))?;
    args.check_devices(count)
}

/// Prints rank 0's result: the table (with several pairs, each pair's rows prefixed `[gpu N]`
/// and the `[AGGREGATE]` lines) and the validation line.
fn print_outcome(out: &Outcome) {
    if out.pairs.is_empty() {
        println!("{}", report::table(&out.rows));
        if let Some(p) = &out.paged {
            println!("{}", p.lines());
        }
    } else {
        for p in &out.pairs {
            println!("{}", report::prefixed(&format!("[gpu {}]", p.gpu), &report::table(&p.rows)));
        }
        println!("{}", report::prefixed("[AGGREGATE]", &report::table(&out.rows)));
    }
    println!("validation: {}", out.validation);
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    let child = match child_identity(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
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
            if args.rank == 0 && child.is_none() {
                if let Err(e) = std::fs::OpenOptions::new().create(true).append(true).open(p) {
                    eprintln!("error: {flag} {}: {e}", p.display());
                    return ExitCode::from(2);
                }
            }
        }
    }
    let done = Arc::new(AtomicU8::new(0));
    let n = args.pairs();
    if let Some((rank, index)) = child {
        args.rank = rank;
        args.local_index = index;
    }
    let port;
    let mut root: Option<std::net::TcpListener> = None;
    // Processes this one starts: with --local every other one (both sides), else the other
    // processes of its own side; started processes start nothing.
    let mut to_start: Vec<(usize, u32)> = Vec::new();
    if args.local {
        if args.rank != 0 && child.is_none() {
            eprintln!("error: --local starts rank 1 itself; do not pass --rank {}", args.rank);
            return ExitCode::from(2);
        }
        let lo = args.master_ip == "127.0.0.1" || args.master_ip == "localhost";
        if !lo || args.self_ip.as_deref().is_some_and(|s| s != "127.0.0.1") {
            eprintln!("error: --local runs both ranks on loopback; drop --master-ip/--self-ip (or run the two ranks by hand)");
            return ExitCode::from(2);
        }
        if child.is_some() {
            match local_child() {
                Ok((p, token)) => (port, args.run_token) = (p, Some(token)),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        } else {
            // The root listens on the bootstrap port before any child starts (--port, or one
            // the kernel picks), so no other run can take it or join this one through it
            // (see mori_bench::local); the engines use ports the kernel picks.
            let want = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, args.port.unwrap_or(0)));
            let l = match mori_bootstrap::SocketBootstrap::bind_root(want) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!(
                        "error: --local: bootstrap port: {e}{}",
                        if args.port.is_some() { "; pick another --port, or leave --port out (the kernel picks a free one)" } else { "" }
                    );
                    return ExitCode::from(2);
                }
            };
            port = match l.local_addr() {
                Ok(a) => a.port(),
                Err(e) => {
                    eprintln!("error: --local: bootstrap listener address: {e}");
                    return ExitCode::from(2);
                }
            };
            root = Some(l);
            args.run_token = Some(RunToken::generate());
            to_start = (0..2).flat_map(|r| (0..n).map(move |i| (r, i))).skip(1).collect();
        }
    } else {
        port = args.port.unwrap_or(DEFAULT_PORT);
        if child.is_none() {
            to_start = (1..n).map(|i| (args.rank, i)).collect();
        }
    }
    if !to_start.is_empty() {
        if let Err(e) = check_gpus(&args) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let mut started = Vec::new();
    for (r, i) in to_start {
        match spawn_rank(r, i, args.run_token.map(|t| (port, t))) {
            Ok(c) => started.push(c),
            Err(e) => {
                eprintln!("error: {e}");
                for (_, mut c) in started {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return ExitCode::from(2);
            }
        }
    }
    let watcher = (!started.is_empty()).then(|| {
        let d = done.clone();
        std::thread::spawn(move || watch(started, d))
    });
    let ranks_here = if args.local { 2 * u64::from(n) } else { u64::from(n) };
    let r = if args.xgmi_single_process { run_single_process(&args) } else { run(&args, port, ranks_here, root) };
    done.store(if r.is_err() { 2 } else { 1 }, Ordering::Release);
    let child_codes = watcher.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    match r {
        Err(Failure { msg, code }) => {
            eprintln!("error (rank {}): {msg}", args.global_rank());
            ExitCode::from(code as u8)
        }
        Ok(out) => {
            if args.global_rank() != 0 {
                return ExitCode::SUCCESS;
            }
            print_outcome(&out);
            let mut code = if out.validation.starts_with("FAILED") { 1 } else { 0 };
            if let Some(p) = &args.json {
                if let Err(e) = report::write_json(p, &args.workload(), &out.validation, &out.rows, out.paged.as_ref()) {
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
            for (name, c) in child_codes {
                match c {
                    Some(0) => {}
                    Some(c) => {
                        eprintln!("error: {name} exited with status {c}");
                        code = 1;
                    }
                    None => {
                        eprintln!("error: {name} did not exit in time and was killed");
                        code = 1;
                    }
                }
            }
            ExitCode::from(code)
        }
    }
}
