# V1 and V1-LL through the device calls at the DeepSeek-V3 shape over xgmi and at decode over
# tcp (4 lanes), 2 nodes x 4 ranks on one GPU: the inter-node EP table's V1 and V1-LL rows
# over tcp and at the DeepSeek-V3 shape (docs/gpu-run/relays.txt, handover-relays.txt). A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to
# $OUT/relays.txt. About 2 minutes on one H100/H200.
rl_log="$OUT/relays.txt"
rll() { ep_logged "$rl_log" 8 "^copy pools|^calls: |^proxies|^host time" "$@"; }
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2 --device-api"
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16 --transport tcp --iters 5 --warmup 2 --device-api"
for kt in v1 v1_ll; do
  step "relays: $kt at the DeepSeek-V3 shape over xgmi, and decode over tcp"
  rll "$kt V3 xgmi" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $v3
  rll "$kt decode tcp" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $dec
done
