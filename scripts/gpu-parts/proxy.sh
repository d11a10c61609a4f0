# GPU warps driving MORI-IO through the proxy's command ring (issue 17's transport substrate).
# A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc). Appends to $OUT/proxy.txt.
# About 1 minute on one H200.
#
# - mori-gpu's mapped pinned memory tests (the ring region and the counters live there).
# - bench_proxy over xgmi (GPU windows) and tcp (pinned host windows the kernel stages into):
#   per message size the GPU ring round trip (push, proxy, signalled write, counter seen by
#   the kernel) against the host posting the same signalled write in the same run, then the
#   flood (every warp stages chunks and pushes commands; every destination byte checked).

proxy_log="$OUT/proxy.txt"
px() { logged "$proxy_log" 240 40 "^$" "$@"; }
step "proxy: mapped pinned memory tests"
px "mapped memory tests" "$B/gpu" --ignored --nocapture --test-threads=1 mapped
step "proxy: bench_proxy over xgmi, 8 B .. 16 MiB, flood 32 warps x 64 x 64 KiB"
px "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi
step "proxy: bench_proxy over tcp (4 lanes, host staging), 8 B .. 16 MiB, flood"
px "bench_proxy tcp" "$B/bench_proxy" --transport tcp --iters 100
step "proxy: bench_proxy over tcp with 8 lanes"
px "bench_proxy tcp 8 lanes" "$B/bench_proxy" --transport tcp --lanes 8 --iters 100 --sizes 4096,1048576
