# The inter-node kernels that wait for nothing (dispatch's and combine's staging, the copy-out,
# combine's sum) on their own grid: correctness first, then how their grid changes the times,
# 2 nodes x 4 ranks on one GPU. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step,
# rc); appends to $OUT/grid.txt and prints what matters to stdout (the device tool returns
# few files). 1 test binary and 15 bench runs, each cut off at 300 s.
#
# - the inter-node GPU tests (AsyncLL, V1-LL and V1, xgmi and tcp legs, bit-exact);
# - each kernel type at the decode shape over xgmi with --copy-blocks 16 (the grid the stagings
#   and the sum had as parts of the kernels that wait: the bench's 16 blocks per rank), 32 and
#   64 (the default), twice for V1: dispatch and combine µs and the per-kernel line;
# - V1 decode over tcp and the DeepSeek-V3 shape (T=4096, fp8) over xgmi at the default;
# - a traced V1-LL decode run and rank 0's analysis.
gr_log="$OUT/grid.txt"
gr() { logged "$gr_log" 300 12 "^$|^│|^┌|^└|^├|^rank " "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "grid: inter-node GPU tests (AsyncLL, V1-LL and V1, xgmi and tcp legs, bit-exact)"
logged "$gr_log" 300 14 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
for round in 1 2; do
  step "grid: round $round: V1 decode over xgmi, --copy-blocks 16, 32, 64"
  for cb in 16 32 64; do
    gr "v1 decode xgmi, copy-blocks $cb ($round)" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --copy-blocks "$cb"
  done
done
step "grid: V1-LL and AsyncLL decode over xgmi, --copy-blocks 16 and 64"
for kt in v1_ll async_ll; do
  for cb in 16 64; do
    gr "$kt decode xgmi, copy-blocks $cb" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $dec --copy-blocks "$cb"
  done
done
step "grid: V1 decode over tcp; V1 DeepSeek-V3 shape over xgmi (default grid)"
gr "v1 decode tcp" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2
gr "v1 V3 xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "grid: V1-LL decode over xgmi, traced, and rank 0's analysis"
mkdir -p "$OUT/trace"
gr "v1_ll decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec --trace "$OUT/trace/grid-v1ll.json"
gr "trace analyze v1_ll rank 0" "$B/mori" trace analyze "$OUT/trace/grid-v1ll.rank0.json" --out "$OUT/trace/grid-v1ll.rank0.png"
