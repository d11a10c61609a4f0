# Three builds through the device-resident calls, 2 nodes x 4 ranks on one GPU, in rotating
# rounds: this one ($B/bench_dispatch_combine), an intermediate one
# ($B/bench_dispatch_combine_mid) and an earlier one ($B/bench_dispatch_combine_prev), both
# carried beside the bundle; then the inter-node EP table's other rows with this build and
# their baselines, in the same run. In docs/gpu-run/handover.txt this build was the staging
# kernel's hand-over with each kernel launched on both nodes' streams before the next and the
# sum at 64 registers, the intermediate one the same at 90 registers, the earlier one
# mori_ie_dispatch's block 0 handing over, each node's kernels launched in turn. A fragment,
# sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/handover.txt. About 3
# minutes on one H100.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, bit-exact, the device
#   calls);
# - AsyncLL decode over xgmi, the three builds, three rounds in rotating order; V1 and V1-LL,
#   the earlier build and this one;
# - this build: AsyncLL decode traced (every rank's Perfetto file kept as
#   $OUT/handover-asyncll.rankR.json, one clock), through the host calls, at 2 x 1 and 2 x 2,
#   over tcp, at the DeepSeek-V3 shape;
# - the targets' baselines (ep_targets).
ho_log="$OUT/handover.txt"
hol() { ep_logged "$ho_log" 12 "^copy pools|^calls: " "$@"; }
dec=$EP_DEC
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2"
ep_tests "$ho_log" handover
ep_prev "$ho_log"
ho2() { ep_ab hol "$prev" "$@"; }
ep_rounds hol handover "pmn mnp npm" "async_ll decode xgmi" --kernel-type async_ll --num-nodes 2 $dec
step "handover: V1 and V1-LL"
ho2 "v1 decode xgmi" np --kernel-type v1 --num-nodes 2 $dec
ho2 "v1_ll decode xgmi" pn --kernel-type v1_ll --num-nodes 2 $dec
step "handover: this build traced, through the host calls, at 2 x 1 and 2 x 2, over tcp, V3"
ep_trace_all hol "async_ll decode xgmi traced, this build" handover-asyncll --kernel-type async_ll --num-nodes 2 $dec
hol "async_ll decode xgmi, host calls, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
hol "async_ll decode xgmi W=2, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec --device-api
hol "async_ll decode xgmi W=4, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec --device-api
hol "async_ll decode tcp, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2 --device-api
hol "async_ll V3 xgmi, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $v3 --device-api
step "handover: the targets' baselines"
ep_targets "$ho_log" $dec
