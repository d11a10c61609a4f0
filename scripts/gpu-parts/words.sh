# The proxies' counter pairs as MORI-IO tail words (this build's default for bursts to one
# destination: the segment's copy-engine copy, then the pair and the completion flag in one
# stream batch) against the pair copied from the window in one ordered-copy kernel launch
# (MORI_EP_PROXY_TAIL_WORDS=0, same binary), alternating: the inter-node EP GPU tests, the
# xgmi backend's GPU tests and mori-gpu's copies-then-stream-writes test first, then the leg
# alone (2 x 1, rank 0 routing every token to node 1) at T = 32, 128 and 512 in two rounds,
# each size beside bench_engine's batch-1 xgmi write of the dispatch write's size (post and
# wait split), V1 and V1-LL's leg alone at T = 128, the 2 x 4 decode rows of the three schemes
# (AsyncLL also with every burst as tail words), and the targets' baselines. A fragment,
# sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/words.txt.
tw_log="$OUT/words.txt"
twl() { ep_logged "$tw_log" 14 "^calls: |^spread|^host time" "$@"; }
# A dispatch record at H = 7168 bf16, top-8 (legs.sh).
tw_rec=14448
ep_tests "$tw_log" words
logged "$tw_log" 300 6 "^$" "xgmi backend GPU tests" "$B/xgmi_gpu" --ignored --test-threads=1
logged "$tw_log" 120 6 "^$" "mori-gpu copies then stream writes" "$B/gpu" --ignored --test-threads=1 copy_pool_copies_then
# tw_ab NAME ORDER ARGS...: bench_dispatch_combine ARGS --device-api once per letter of ORDER:
# o pairs copied (MORI_EP_PROXY_TAIL_WORDS=0), s single-destination bursts' pairs as tail
# words, a every burst's.
tw_ab() {
  local name=$1 order=$2 x v
  shift 2
  for x in $(echo "$order" | grep -o .); do
    case $x in
      o) v=0 ;;
      s) v=single ;;
      a) v=all ;;
    esac
    twl "$name, MORI_EP_PROXY_TAIL_WORDS=$v" env MORI_EP_PROXY_TAIL_WORDS=$v "$B/bench_dispatch_combine" "$@" --device-api
  done
}
tw_leg="--world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5"
for round in 1 2; do
  ord=os
  [ "$round" = 2 ] && ord=so
  for t in 32 128 512; do
    step "words: round $round: T = $t, the leg alone against bench_engine at $((t * tw_rec)) B"
    # shellcheck disable=SC2086
    tw_ab "async_ll 2x1 leg alone T=$t ($round)" "$ord" --kernel-type async_ll --num-tokens "$t" --hidden 7168 \
      --num-experts 256 --top-k 8 --dtype bf16 $tw_leg
    logged "$tw_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * tw_rec)) B ($round)" env MORI_BENCH_SPLIT=1 \
      "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 \
      --buffer-size $((t * tw_rec)) --iters 200 --warmup-iters 20 --copy-baseline --log-level warning
  done
done
step "words: V1 and V1-LL, the leg alone, T = 128"
# shellcheck disable=SC2086
tw_ab "v1 2x1 leg alone T=128" os --kernel-type v1 $EP_DEC $tw_leg
# shellcheck disable=SC2086
tw_ab "v1_ll 2x1 leg alone T=128" so --kernel-type v1_ll $EP_DEC $tw_leg
step "words: 2 x 4 decode over xgmi, the three schemes"
round=0
for kt in v1_ll async_ll v1 v1_ll; do
  round=$((round + 1))
  ord=os
  [ $((round % 2)) = 0 ] && ord=so
  [ "$kt" = async_ll ] && ord=osa
  # shellcheck disable=SC2086
  tw_ab "$kt decode xgmi ($round)" "$ord" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
step "words: the targets' baselines"
# shellcheck disable=SC2086
ep_targets "$tw_log" $EP_DEC
