# The relay's sums with the node's ranks checked after the sums (this build) against the build
# before it ($B/bench_dispatch_combine_mid, the check before the sums), V1 and V1-LL: the
# inter-node EP GPU tests, decode over xgmi in two rounds of rotating order, V1 at the
# DeepSeek-V3 shape. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends
# to $OUT/relaycheck.txt. About 3 minutes on one H100.
rc_log="$OUT/relaycheck.txt"
rcl() { ep_logged "$rc_log" 12 "^copy pools|^calls: |^proxies" "$@"; }
ep_tests "$rc_log" relaycheck
prev=""
for kt in v1_ll v1; do
  ep_rounds rcl relaycheck "mn nm" "$kt decode xgmi" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
ep_rounds rcl relaycheck "mn" "v1 V3 xgmi" --kernel-type v1 --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
