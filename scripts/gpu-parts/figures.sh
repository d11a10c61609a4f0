# The inter-node EP table's figures in one short call (about 3 minutes on one H100/H200): the
# inter-node GPU tests, V1, V1-LL and AsyncLL decode over xgmi (AsyncLL traced, and at 2 x 1,
# 2 x 2, over tcp and at the DeepSeek-V3 shape; rank 0's trace kept as
# $OUT/figures-asyncll.rank0.json), and the targets' baselines in the same run
# (bench_proxy round trips over xgmi and tcp, bench_engine batch-1 xgmi writes at the legs'
# sizes, the intranode kernels at 8 ranks). A fragment, sourced by scripts/gpu-machine.sh (B,
# OUT, step, rc); appends to $OUT/figures.txt. scripts/gpu-parts/asyncll.sh is the longer set
# (tcp and V3 for every scheme, the PyTorch baseline).
fg_log="$OUT/figures.txt"
fgl() { ep_logged "$fg_log" 12 "^copy pools" "$@"; }
dec=$EP_DEC
ep_tests "$fg_log" figures
step "figures: decode over xgmi"
fg_tr=$(mktemp -d)
fgl "async_ll decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$fg_tr/al.json"
cp "$fg_tr/al.rank0.json" "$OUT/figures-asyncll.rank0.json" 2>/dev/null || true
rm -rf "$fg_tr"
fgl "async_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
fgl "v1 decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
fgl "v1_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec
fgl "async_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec
fgl "async_ll decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec
step "figures: AsyncLL over tcp, and at the DeepSeek-V3 shape over xgmi"
fgl "async_ll decode tcp" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2
fgl "async_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "figures: the targets' baselines"
logged "$fg_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$fg_log" 120 8 "^$" "bench_proxy tcp" "$B/bench_proxy" --transport tcp --sizes 8,1213632 --iters 50 --flood-bytes 0
logged "$fg_log" 120 12 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write, leg sizes" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 262144 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
logged "$fg_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
