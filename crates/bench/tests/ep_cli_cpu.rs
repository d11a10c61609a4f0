//! bench_dispatch_combine's `--device`, `--num-nodes`, `--local`, `--ranks-per-proc` and
//! launcher-environment flags: refusals name the user's flags (or the launcher's variables)
//! before any GPU or network is touched.

use std::process::Command;

/// Launcher variables the bench reads; removed so that the host's own cannot leak in.
const LAUNCHER_VARS: &[&str] = &[
    "MORI_RANK",
    "MORI_WORLD_SIZE",
    "MORI_MASTER_ADDR",
    "MORI_MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench_dispatch_combine"));
    c.args(args).args(["--num-tokens", "8", "--hidden", "256", "--num-experts", "32", "--top-k", "2"]);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.envs(env.iter().copied()).env("MORI_GPU_RUNTIME", "auto");
    let out = c.output().expect("spawn bench_dispatch_combine");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn refused(args: &[&str], env: &[(&str, &str)], wants: &[&str]) {
    let (code, text) = run(args, env);
    assert_eq!(code, 1, "{args:?}: {text}");
    assert!(text.contains("bench_dispatch_combine: error:"), "{args:?}: {text}");
    for want in wants {
        assert!(text.contains(want), "{args:?} {env:?}: wanted {want:?} in {text}");
    }
    assert!(!text.contains("no GPU runtime"), "refused before the GPU: {text}");
}

#[test]
fn node_flags() {
    refused(&["--num-nodes", "2", "--gpus-per-node", "3"], &[], &["--num-nodes 2 and --gpus-per-node 3 disagree", "4 per node"]);
    refused(&["--num-nodes", "3"], &[], &["--num-nodes 3 must divide --world-size 8"]);
    refused(
        &["--num-nodes", "2", "--procs", "2", "--num-gpus", "2"],
        &[],
        &["--kernel-type v1 on GPUs runs every rank in this process on one GPU", "drop --procs"],
    );
    refused(
        &["--device", "cpu", "--local", "--num-nodes", "2", "--kernel-type", "intranode"],
        &[],
        &["--kernel-type intranode with --world-size 8 and --num-nodes 2 (2 nodes)"],
    );
    refused(
        &["--device", "cpu", "--local", "--num-nodes", "2", "--kernel-type", "v1", "--block-num", "1"],
        &[],
        &["--block-num 1 with --kernel-type v1 leaves no XGMI block"],
    );
}

#[test]
fn flags_of_the_other_device() {
    refused(&["--device", "cpu", "--local", "--procs", "2"], &[], &["--procs is a --device gpu flag"]);
    refused(&["--device", "cpu", "--local", "--trace", "/tmp/t.json"], &[], &["--trace is a --device gpu flag"]);
    refused(&["--local"], &[], &["--local is a --device cpu flag"]);
    refused(&["--lanes", "2"], &[], &["--transport/--lanes on GPUs choose the inter-node leg of --kernel-type v1, v1_ll or async_ll"]);
    refused(&["--device", "cpu", "--local", "--lanes", "0"], &[], &["--lanes 0"]);
    refused(&["--device", "cpu", "--local", "--transport", "rdma", "--lanes", "2"], &[], &["--lanes with --transport rdma"]);
    refused(&["--device", "cpu", "--local", "--ranks-per-proc", "3"], &[], &["--ranks-per-proc 3 must divide --world-size 8"]);
    refused(&["--device", "cpu", "--local", "--inject-reorder"], &[], &["--inject-reorder needs --inject-delay-us"]);
}

#[test]
fn launcher_environment() {
    refused(&["--device", "cpu"], &[], &["--device cpu without --local", "torchrun", "pass --local"]);
    let torchrun = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29999")];
    refused(
        &["--device", "cpu", "--world-size", "8", "--ranks-per-proc", "2"],
        &torchrun,
        &["--world-size 8 disagrees with the launcher's 2 processes", "--ranks-per-proc 2 = 4 ranks"],
    );
    let mut odd = torchrun.to_vec();
    odd[1] = ("WORLD_SIZE", "4");
    odd.push(("LOCAL_WORLD_SIZE", "3"));
    refused(
        &["--device", "cpu"],
        &odd,
        &["LOCAL_WORLD_SIZE=3 processes per node x --ranks-per-proc 1 = 3 ranks per node must divide the 4 ranks"],
    );
    // LOCAL_WORLD_SIZE = 2 of 4 processes: two nodes, so intranode is refused with the launcher named.
    let mut two = torchrun.to_vec();
    two[1] = ("WORLD_SIZE", "4");
    two.push(("LOCAL_WORLD_SIZE", "2"));
    refused(
        &["--device", "cpu", "--kernel-type", "intranode"],
        &two,
        &["--kernel-type intranode with --world-size 4 (2 ranks per node: LOCAL_WORLD_SIZE=2 processes per node x --ranks-per-proc 1) (2 nodes)"],
    );
}
