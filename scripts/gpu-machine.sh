#!/usr/bin/env bash
# Runs on the GPU machine (one NVIDIA H200, CUDA 13.0 driver, no Rust): correctness first,
# then timings, from binaries built elsewhere by `cargo xtask gpu-bundle` into .gpu-bundle/.
# Writes logs and JSON under $OUT (or ./gpu-out). Usage: bash scripts/gpu-machine.sh
set -u -o pipefail
B=.gpu-bundle
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
rc=0
step() { echo; echo "=== $*"; }
# shellcheck source=scripts/gpu-parts/lib.sh
. scripts/gpu-parts/lib.sh
# PARTS picks sections (default all): base (GPU crate, xgmi, cli tests, topology, peer-bw,
# same-GPU xgmi sweeps, kernel check), xgmi (scripts/gpu-parts/xgmi.sh), fabric
# (scripts/gpu-parts/fabric.sh), ep (scripts/gpu-parts/ep.sh), and, only when named,
# xgmibw (scripts/gpu-parts/xgmibw.sh: alternating rounds of bare copies and xgmi batch-1
# sweeps at 4..64 MiB) and lat (scripts/gpu-parts/lat.sh: the same for batch-1 latency,
# 8 B..64 KiB, xgmi and fabric), pair (scripts/gpu-parts/pair.sh: the GPU tests of the
# transfer path, then batch-1 latency against bench_engine --copy-baseline, also per NUMA
# node), and, only when named, paged (scripts/gpu-parts/paged.sh: bench_engine --paged on xgmi
# and fabric for the paged KV-cache shapes, with same-run contiguous baselines), and, only when
# named, py (scripts/gpu-parts/py.sh: the mori_rs wheel against NIXL from Python; carry .whl/
# and .gpu-bundle/bench_engine.xz), and, only when named, proxy (scripts/gpu-parts/proxy.sh:
# bench_proxy, GPU warps driving MORI-IO through the proxy's command ring, and AsyncLL across
# nodes on one GPU: its GPU tests and bench_dispatch_combine --kernel-type async_ll), and,
# only when named, asyncll (scripts/gpu-parts/asyncll.sh: the inter-node GPU tests of V1,
# V1-LL and AsyncLL, traced benches and their same-run baselines, without the proxy sweeps), and,
# only when named, post (scripts/gpu-parts/post.sh: where the inter-node proxies' posting time
# goes: copy-pool submission split, event queries, busy cores; completion by events against
# completion flags), and, only when named, flags (scripts/gpu-parts/flags.sh: completion by
# events against flags in alternating rounds: bench_engine latency and bandwidth, the EP
# kernel types, then the GPU tests with flags on), and, only when named, grid
# (scripts/gpu-parts/grid.sh: the inter-node GPU tests, then the kernels that wait for nothing
# at 16, 32 and 64 blocks per rank), and, only when named, spin (scripts/gpu-parts/spin.sh: the
# proxies polling an idle ring for 200 µs against 100 ms), and, only when named, ordered
# (scripts/gpu-parts/ordered.sh: the copy pool's ordered-copy kernel against copies, its GPU
# tests, then the EP kernel types both ways), and, only when named, rowcopy
# (scripts/gpu-parts/rowcopy.sh: this build's inter-node EP kernels against an earlier build's
# bench_dispatch_combine_prev, alternating), and, only when named, grouped
# (scripts/gpu-parts/grouped.sh: a proxy's burst of ordered batches in one MORI-IO call against
# one post per destination, with the GPU tests), and, only when named, combrows
# (scripts/gpu-parts/combrows.sh: AsyncLL's combine input in the window against staging it),
# and, only when named, recvwin (scripts/gpu-parts/recvwin.sh: the received records read from
# the window against a copy-out kernel, and both against an earlier build carried as
# .gpu-bundle/bench_dispatch_combine_prev), and, only when named, figures
# (scripts/gpu-parts/figures.sh: the inter-node EP table's figures and baselines, short), and,
# only when named, devapi (scripts/gpu-parts/devapi.sh: InterNodeGpu's device-resident calls
# against its host-bytes calls, with the GPU tests), and, only when named, fused
# (scripts/gpu-parts/fused.sh: the layout in the dispatch staging kernel against the earlier
# build carried as .gpu-bundle/bench_dispatch_combine_prev, then the inter-node EP table's
# figures and baselines), and, only when named, grid2 (scripts/gpu-parts/grid2.sh: AsyncLL's
# grids swept through the device calls), and, only when named, relays
# (scripts/gpu-parts/relays.sh: V1 and V1-LL at the DeepSeek-V3 shape and over tcp through the
# device calls), and, only when named, handover (scripts/gpu-parts/handover.sh: the dispatch
# staging kernel handing the staged records to the proxy, against the earlier build carried as
# .gpu-bundle/bench_dispatch_combine_prev, then the inter-node EP table's figures and
# baselines), and, only when named, breadth (scripts/gpu-parts/breadth.sh: the launch order and
# the sum's registers with mori_ie_dispatch handing over, against the earlier build and the
# hand-over build, carried as .gpu-bundle/bench_dispatch_combine_prev and _mid), and, only
# when named, depth (scripts/gpu-parts/depth.sh: this build against the earlier build and the
# breadth-first one, carried as .gpu-bundle/bench_dispatch_combine_prev and _mid, with the
# targets' baselines), and, only when named, legs (scripts/gpu-parts/legs.sh: the inter-node
# leg alone against bench_engine at the same sizes, then the 2 x 4 decode rows and their
# baselines), and, only when named, relay (scripts/gpu-parts/relay.sh: the relay's partial
# sums in a kernel of their own against the earlier build carried as
# .gpu-bundle/bench_dispatch_combine_prev, with the GPU tests, baselines and traces), and,
# only when named, armed (scripts/gpu-parts/armed.sh: the copy pool's GPU tests, with the
# armed ordered-copy launches'), and, only when named, inplace (scripts/gpu-parts/inplace.sh:
# V1 and V1-LL combine reading their rows in the window against staging them and against the
# earlier build carried as .gpu-bundle/bench_dispatch_combine_prev, with the GPU tests,
# baselines and a trace), and, only when named, fan (scripts/gpu-parts/fan.sh: a token's
# records written to up to four destinations at once, against the two builds before it carried
# as .gpu-bundle/bench_dispatch_combine_prev and _mid, with the GPU tests, baselines, the
# DeepSeek-V3 shape, tcp and a trace), and, only when named, fences
# (scripts/gpu-parts/fences.sh: fan.sh's steps for the staging's hand-over ordered at device
# scope, against the two builds before it, logged to fences.txt), and, only when named,
# relaycheck (scripts/gpu-parts/relaycheck.sh: the relay's sums checking the node's ranks
# after the sums, against the build before it carried as .gpu-bundle/bench_dispatch_combine_mid),
# and, only when named, sessions (scripts/gpu-parts/sessions.sh: the proxies' ordered batches
# over MORI-IO sessions against the engine's one-shot calls, the leg alone beside
# bench_engine's split, decode rows and baselines), and, only when named, legwait
# (scripts/gpu-parts/legwait.sh: the leg alone's ordered batch as one kernel launch against two
# copy-engine copies, beside bench_engine's split), and, only when named, words
# (scripts/gpu-parts/words.sh: the proxies' counter pairs as MORI-IO tail words against the
# pair copied in the ordered-copy kernel's launch, the leg alone beside bench_engine's split,
# decode rows and baselines), and, only when named, resident (scripts/gpu-parts/resident.sh:
# the copy pool's resident copier against a launch per post, the EP GPU tests both ways, the
# leg alone beside bench_engine's split, decode rows and baselines).
# One run
# stays under the device tool's 10-minute limit with
# PARTS="base xgmi fabric", PARTS="xgmi xgmibw" or PARTS="ep".
# PARTS="multi" (for a machine with several GPUs, after the single-GPU parts ran elsewhere):
# topology, peer-bw over all pairs, and only the multi-GPU sections of xgmi.sh and ep.sh.
PARTS=${PARTS:-base xgmi fabric ep}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$OUT/bench.txt"
if has base; then
step "topology: nvidia-smi topo -m, read by mori topo"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
cat "$OUT/topo.txt"
"$B/mori" topo --input "$OUT/topo.txt" 2>&1 | tee -a "$OUT/bench.txt" || rc=1
step "mori-gpu tests (runtime, IPC across processes, VMM/POSIX FD, FABRIC diagnosis, dmabuf, kernels)"
"$B/gpu" --ignored --nocapture --test-threads=1 >"$OUT/tests.log" 2>&1 || rc=1
grep -E "^test |test result" "$OUT/tests.log"
step "mori-shmem tests (put, put-with-signal, atomic add, wait-until, bounds)"
"$B/shmem_gpu" --ignored --nocapture --test-threads=1 >>"$OUT/tests.log" 2>&1 || rc=1
grep -E "^test |test result" "$OUT/tests.log" | tail -n 2
step "xgmi backend tests (same process and two processes on one GPU)"
"$B/xgmi_gpu" --ignored --nocapture --test-threads=1 >>"$OUT/tests.log" 2>&1 || rc=1
grep -E "^test |test result" "$OUT/tests.log" | tail -n 8
step "mori check, mori peer-bw (self pair), and their GPU tests"
MORI_BIN="$B/mori" "$B/cli_gpu" --ignored --nocapture --test-threads=1 >>"$OUT/tests.log" 2>&1 || rc=1
grep -E "^test |test result" "$OUT/tests.log" | tail -n 4
"$B/mori" check 2>&1 | tee -a "$OUT/bench.txt" | tail -n 40
"$B/mori" peer-bw --topo "$OUT/topo.txt" 2>&1 | tee -a "$OUT/bench.txt" | tail -n 16 || rc=1
step "bench_engine --backend xgmi, two processes on GPU 0 (real IPC), 8 B .. 64 MiB"
for op in write read; do
  for b in 1 128; do
    echo "--- op $op, batch $b"
    "$B/bench_engine" --local --backend xgmi --mem-type gpu --op "$op" --enable-sess --all \
      --sweep-start 8 --sweep-max 67108864 --transfer-batch-size "$b" --iters 50 --warmup-iters 5 \
      --log-level warning --json "$OUT/xgmi-$op-b$b.json" 2>&1 | tee -a "$OUT/bench.txt" | tail -n 30 || rc=1
  done
done
step "bench_engine --backend xgmi --xgmi-single-process (one process, no IPC), 8 B .. 64 MiB"
for op in write read; do
  for b in 1 128; do
    echo "--- single process, op $op, batch $b"
    "$B/bench_engine" --xgmi-single-process --backend xgmi --mem-type gpu --op "$op" --enable-sess --all \
      --sweep-start 8 --sweep-max 67108864 --transfer-batch-size "$b" --iters 50 --warmup-iters 5 \
      --log-level warning 2>&1 | tee -a "$OUT/bench.txt" | grep -v CUDA_ERROR_DEINITIALIZED | tail -n 30 || rc=1
  done
done
step "plain device-to-device copy on the same GPU (torch), the roofline"
python3 - <<'PY' 2>&1 | tee -a "$OUT/bench.txt"
import torch, time
for mb in (1, 16, 64, 1024):
    n = mb << 20
    a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); t = time.perf_counter(); it = 50
    for _ in range(it): b.copy_(a)
    torch.cuda.synchronize(); dt = time.perf_counter() - t
    print(f"copy {mb:5d} MiB: {n * it / dt / 1e9:8.1f} GB/s payload")
PY
step "scatter/gather kernel check (cubin and PTX against a host reference)"
python3 kernels/check_on_gpu.py 2>&1 | tee -a "$OUT/bench.txt" | tail -n 25 || rc=1
fi
if has multi; then
  step "topology: nvidia-smi topo -m, read by mori topo; peer-bw over every ordered GPU pair"
  nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
  cat "$OUT/topo.txt"
  "$B/mori" topo --input "$OUT/topo.txt" 2>&1 | tee -a "$OUT/bench.txt" || rc=1
  "$B/mori" peer-bw --topo "$OUT/topo.txt" 2>&1 | tee -a "$OUT/bench.txt" | tail -n 24 || rc=1
  export ONLY_MULTI=1
  PARTS="$PARTS xgmi ep"
fi
for part in py pair paged proxy ordered grouped combrows recvwin figures devapi fused handover breadth depth legs relay inplace fan fences relaycheck sessions legwait words resident armed grid2 relays rowcopy asyncll post flags grid spin xgmi lat xgmibw fabric ep; do
  if has "$part"; then
    # shellcheck source=/dev/null
    . "scripts/gpu-parts/$part.sh"
  fi
done
echo "exit $rc"
exit $rc
