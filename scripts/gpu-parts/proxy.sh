# GPU warps driving MORI-IO through the proxy's command ring, and MORI-EP AsyncLL across nodes
# on one GPU through it. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc).
# Appends to $OUT/proxy.txt. About 2 minutes on one H100/H200.
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
step "proxy: AsyncLL across 2 nodes x 4 ranks on one GPU (xgmi and tcp), bit-exact against the reference"
px "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --nocapture --test-threads=1
step "proxy: bench_dispatch_combine --kernel-type async_ll, decode and DeepSeek-V3 shapes"
px "async_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16
px "async_ll decode tcp" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16 --transport tcp --iters 5 --warmup 2
px "async_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
