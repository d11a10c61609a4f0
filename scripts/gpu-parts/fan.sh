# A token's records written to up to four destinations at once (this node's P2P stores, V1-LL's
# relay staging) against the build before it ($B/bench_dispatch_combine_mid: V1 and V1-LL
# combine with no staging kernel, their rows read in the window) and the one before that
# ($B/bench_dispatch_combine_prev: the same with a staging kernel that only set the relays'
# gather counters), through the device-resident calls, 2 nodes x 4 ranks on one GPU, decode
# over xgmi in two rounds of rotating order; the inter-node EP GPU tests first, then the
# targets' baselines, the DeepSeek-V3 shape and tcp decode of this build, V1-LL traced (every
# rank's Perfetto file kept as $OUT/fan-v1_ll.rankR.json). A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/fan.txt. About 6 minutes on one
# H100. FAN_ORDERS (default "pmn nmp") shortens it, FAN_SHORT=1 stops after the baselines;
# FAN_NAME (default fan) names the log, the steps and the traces.
fn="${FAN_NAME:-fan}"
fn_log="$OUT/$fn.txt"
fnl() { ep_logged "$fn_log" 12 "^copy pools|^calls: |^proxies" "$@"; }
ep_tests "$fn_log" "$fn"
ep_prev "$fn_log"
for kt in v1_ll v1 async_ll; do
  ep_rounds fnl "$fn" "${FAN_ORDERS:-pmn nmp}" "$kt decode xgmi" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
step "$fn: the targets' baselines"
ep_targets "$fn_log" $EP_DEC
[ "${FAN_SHORT:-0}" = 1 ] && return 0
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2 --device-api"
tcp="$EP_DEC --transport tcp --iters 5 --warmup 2 --device-api"
for kt in v1 v1_ll async_ll; do
  step "$fn: $kt at the DeepSeek-V3 shape over xgmi"
  fnl "$kt V3 xgmi, this build" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $v3
done
for kt in v1 v1_ll; do
  step "$fn: $kt decode over tcp"
  fnl "$kt decode tcp, this build" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $tcp
done
step "$fn: V1-LL traced"
ep_trace_all fnl "v1_ll decode xgmi, traced" "$fn-v1_ll" --kernel-type v1_ll --num-nodes 2 $EP_DEC
