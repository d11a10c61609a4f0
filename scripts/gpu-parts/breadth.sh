# Three builds through the device-resident calls, 2 nodes x 4 ranks on one GPU, AsyncLL and
# V1-LL in rotating rounds: this one ($B/bench_dispatch_combine), an intermediate one
# ($B/bench_dispatch_combine_mid) and an earlier one ($B/bench_dispatch_combine_prev), both
# carried beside the bundle; then this build traced and the targets' baselines. In
# docs/gpu-run/breadth.txt this build launched each kernel on both nodes' streams before the
# next with mori_ie_dispatch's block 0 handing over and the sum at 64 registers, the
# intermediate one the same with the staging kernel's hand-over (handover.txt's final build),
# the earlier one each node's kernels in turn and 90 registers. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/breadth.txt. About 70 seconds on
# one H100.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, bit-exact, the device
#   calls);
# - AsyncLL and V1-LL decode over xgmi, the three builds, two rounds each in rotating order;
#   V1, the earlier build and this one;
# - this build: AsyncLL decode traced (every rank's Perfetto file kept as
#   $OUT/breadth-asyncll.rankR.json, one clock);
# - the targets' baselines (ep_targets).
br_log="$OUT/breadth.txt"
brl() { ep_logged "$br_log" 12 "^copy pools|^calls: " "$@"; }
dec=$EP_DEC
ep_tests "$br_log" breadth
ep_prev "$br_log"
for round in 1 2; do
  step "breadth: round $round: AsyncLL and V1-LL decode over xgmi"
  order=$(echo "pnm mpn" | cut -d' ' -f"$round")
  ep_ab brl "$prev" "async_ll decode xgmi ($round)" "$order" --kernel-type async_ll --num-nodes 2 $dec
  ep_ab brl "$prev" "v1_ll decode xgmi ($round)" "$order" --kernel-type v1_ll --num-nodes 2 $dec
done
ep_ab brl "$prev" "v1 decode xgmi" np --kernel-type v1 --num-nodes 2 $dec
step "breadth: this build traced"
ep_trace_all brl "async_ll decode xgmi traced, this build" breadth-asyncll --kernel-type async_ll --num-nodes 2 $dec
step "breadth: the targets' baselines"
ep_targets "$br_log" $dec
