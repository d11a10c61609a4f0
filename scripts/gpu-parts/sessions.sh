# The proxies' ordered batches over MORI-IO sessions (this build's default) against the
# engine's one-shot calls (MORI_EP_PROXY_SESSIONS=0, same binary), alternating: the inter-node
# EP GPU tests and the xgmi backend's GPU tests (ordered batches over sessions among them)
# first, then the leg alone (2 x 1, rank 0 routing every token to node 1) at T = 32, 128 and
# 512 in two rounds, each size beside bench_engine's batch-1 xgmi write of the dispatch write's
# size with its posting and waiting split (MORI_BENCH_SPLIT, against a bare copy in the same
# process), V1 and V1-LL's leg alone at T = 128, the 2 x 4 decode rows of the three schemes,
# and the targets' baselines. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step,
# rc); appends to $OUT/sessions.txt. About 6 minutes on one H100.
ss_log="$OUT/sessions.txt"
ssl() { ep_logged "$ss_log" 14 "^calls: |^spread|^per kernel|^host time" "$@"; }
# A dispatch record at H = 7168 bf16, top-8 (legs.sh).
ss_rec=14448
ep_tests "$ss_log" sessions
logged "$ss_log" 300 6 "^$" "xgmi backend GPU tests" "$B/xgmi_gpu" --ignored --test-threads=1
# ss_ab NAME ORDER ARGS...: bench_dispatch_combine ARGS --device-api once per letter of ORDER:
# o the engine's one-shot calls, s sessions.
ss_ab() {
  local name=$1 order=$2 x
  shift 2
  for x in $(echo "$order" | grep -o .); do
    case $x in
      o) ssl "$name, one-shot calls" env MORI_EP_PROXY_SESSIONS=0 "$B/bench_dispatch_combine" "$@" --device-api ;;
      s) ssl "$name, sessions" env MORI_EP_PROXY_SESSIONS=1 "$B/bench_dispatch_combine" "$@" --device-api ;;
    esac
  done
}
ss_leg="--world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5"
for round in 1 2; do
  ord=os
  [ "$round" = 2 ] && ord=so
  for t in 32 128 512; do
    step "sessions: round $round: T = $t, the leg alone against bench_engine at $((t * ss_rec)) B"
    # shellcheck disable=SC2086
    ss_ab "async_ll 2x1 leg alone T=$t ($round)" "$ord" --kernel-type async_ll --num-tokens "$t" --hidden 7168 \
      --num-experts 256 --top-k 8 --dtype bf16 $ss_leg
    logged "$ss_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * ss_rec)) B ($round)" env MORI_BENCH_SPLIT=1 \
      "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 \
      --buffer-size $((t * ss_rec)) --iters 200 --warmup-iters 20 --copy-baseline --log-level warning
  done
done
step "sessions: V1 and V1-LL, the leg alone, T = 128"
# shellcheck disable=SC2086
ss_ab "v1 2x1 leg alone T=128" os --kernel-type v1 $EP_DEC $ss_leg
# shellcheck disable=SC2086
ss_ab "v1_ll 2x1 leg alone T=128" so --kernel-type v1_ll $EP_DEC $ss_leg
step "sessions: 2 x 4 decode over xgmi, the three schemes"
round=0
for kt in v1_ll async_ll v1 v1_ll; do
  round=$((round + 1))
  ord=os
  [ $((round % 2)) = 0 ] && ord=so
  # shellcheck disable=SC2086
  ss_ab "$kt decode xgmi ($round)" "$ord" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
step "sessions: the targets' baselines"
# shellcheck disable=SC2086
ep_targets "$ss_log" $EP_DEC
