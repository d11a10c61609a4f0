# The inter-node EP kernels of this build against an earlier build's, alternating, 2 nodes x 4
# ranks on one GPU, decode shape over xgmi: $B/bench_dispatch_combine_prev (carried beside
# the bundle; the part stops if it is missing) is the build before a kernel change. A
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/rowcopy.txt
# and prints, per run, rank 0's row, its spread and the per-kernel line.
#
# - the inter-node GPU tests of this build (all three schemes, xgmi and tcp legs, bit-exact);
# - V1, V1-LL and AsyncLL decode, the earlier build then this one, two rounds.
rc_log="$OUT/rowcopy.txt"
rcl() { logged "$rc_log" 300 14 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^times:|^host CPU|^proxies|^copy pools" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "rowcopy: inter-node GPU tests of this build"
logged "$rc_log" 300 14 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
if [ ! -x "$B/bench_dispatch_combine_prev" ]; then
  echo "FAILED: $B/bench_dispatch_combine_prev is missing (carry the earlier build's binary)" | tee -a "$rc_log"
  rc=1
else
  for round in 1 2; do
    for kt in v1 v1_ll async_ll; do
      step "rowcopy: round $round: $kt decode over xgmi, earlier build then this one"
      rcl "$kt decode xgmi, earlier build ($round)" "$B/bench_dispatch_combine_prev" --kernel-type "$kt" --num-nodes 2 $dec
      rcl "$kt decode xgmi, this build ($round)" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $dec
    done
  done
fi
