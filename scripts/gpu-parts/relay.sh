# The relay's partial sums in a kernel of their own (mori_ie_combine_relay, on the grid of the
# kernels that wait for nothing) and every received row stored by combine's staging kernel,
# against the earlier build ($B/bench_dispatch_combine_prev, carried beside the bundle: both
# inside the co-resident combine send kernel), through the device-resident calls, 2 nodes x 4
# ranks on one GPU, decode over xgmi, V1 and V1-LL in two rounds of alternating order, AsyncLL
# in one; with the inter-node EP GPU tests
# first, the targets' baselines in the same run and this build's V1 traced (every rank's
# Perfetto file kept as $OUT/relay-v1.rankR.json). A
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/relay.txt.
# About 100 seconds on one H100. RELAY_ORDERS (default "pn np": two rounds) and RELAY_TRACE=0
# (no trace) shorten it.
rl_log="$OUT/relay.txt"
rll() { ep_logged "$rl_log" 12 "^copy pools|^calls: |^proxies" "$@"; }
ep_tests "$rl_log" relay
ep_prev "$rl_log"
for kt in v1 v1_ll; do
  ep_rounds rll relay "${RELAY_ORDERS:-pn np}" "$kt decode xgmi" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
ep_rounds rll relay "np" "async_ll decode xgmi" --kernel-type async_ll --num-nodes 2 $EP_DEC
step "relay: the targets' baselines"
ep_targets "$rl_log" $EP_DEC
if [ "${RELAY_TRACE:-1}" = 1 ]; then
  step "relay: V1 traced"
  ep_trace_all rll "v1 decode xgmi, traced" relay-v1 --kernel-type v1 --num-nodes 2 $EP_DEC
fi
