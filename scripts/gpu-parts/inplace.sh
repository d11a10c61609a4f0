# V1 and V1-LL combine reading their rows in the window (IE_FLAG_COMB_ROWS: the relays' partial
# sums and this node's sources read each destination's input in place, no row stored), against
# the same build staging every row (--combine-staging) and the earlier build
# ($B/bench_dispatch_combine_prev, carried beside the bundle: staging, and the relay's rows
# looked up by one lane), through the device-resident calls, 2 nodes x 4 ranks on one GPU,
# decode over xgmi in two rounds of rotating order (p earlier, s staging, n in the window); the
# inter-node EP GPU tests first, AsyncLL once, the targets' baselines, the DeepSeek-V3 shape
# both ways and V1-LL traced (every rank's Perfetto file kept as $OUT/inplace-v1_ll.rankR.json).
# A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to
# $OUT/inplace.txt. About 4 minutes on one H100. INPLACE_ORDERS (default "psn nsp") shortens it.
ip_log="$OUT/inplace.txt"
ipl() { ep_logged "$ip_log" 12 "^copy pools|^calls: |^proxies" "$@"; }
ep_tests "$ip_log" inplace
ep_prev "$ip_log"
for kt in v1 v1_ll; do
  round=0
  for order in ${INPLACE_ORDERS:-psn nsp}; do
    round=$((round + 1))
    step "inplace: round $round: $kt decode xgmi"
    for x in $(echo "$order" | grep -o .); do
      case $x in
        p) [ -n "$prev" ] && ipl "$kt decode xgmi ($round), earlier build" "$prev" --kernel-type "$kt" --num-nodes 2 $EP_DEC --device-api ;;
        s) ipl "$kt decode xgmi ($round), this build, staged" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $EP_DEC --device-api --combine-staging ;;
        n) ipl "$kt decode xgmi ($round), this build, in the window" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $EP_DEC --device-api ;;
      esac
    done
  done
done
step "inplace: async_ll decode xgmi"
ipl "async_ll decode xgmi, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $EP_DEC --device-api
step "inplace: the targets' baselines"
ep_targets "$ip_log" $EP_DEC
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2 --device-api"
for kt in v1 v1_ll; do
  step "inplace: $kt at the DeepSeek-V3 shape over xgmi, staged and in the window"
  ipl "$kt V3 xgmi, this build, staged" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $v3 --combine-staging
  ipl "$kt V3 xgmi, this build, in the window" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $v3
done
step "inplace: V1-LL traced"
ep_trace_all ipl "v1_ll decode xgmi, traced" inplace-v1_ll --kernel-type v1_ll --num-nodes 2 $EP_DEC
