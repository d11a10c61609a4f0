# The inter-node leg's rate against bench_engine on the same transport (xgmi, GPU memory) and
# message sizes, in the same run, as `cargo xtask compare-ep-tcp` does on the host: the leg
# alone is 2 nodes x 1 rank on one GPU with rank 0 routing every token to node 1
# (--remote-only-ranks 0) and rank 1 sending none (--zero-token-ranks 1), so each phase
# carries one write (dispatch: rank 0's T records; combine: rank 1's T rows back); its rate is
# the proxies' bytes over taking the command to completed (the "inter-node writes with data"
# line), against bench_engine batch-1 writes of the dispatch write's size. Then the 2 x 4
# decode rows of the three schemes with their targets' baselines, where the same line gives a
# write's rate under eight proxies. A fragment, sourced by scripts/gpu-machine.sh (B, OUT,
# step, rc); appends to $OUT/legs.txt. About 65 seconds on one H200 with LEGS_TESTS=1 (the
# default: the inter-node EP GPU tests and the copy pool's GPU tests first), 100 with
# LEGS_PREV=1.
lg_log="$OUT/legs.txt"
lgl() { ep_logged "$lg_log" 14 "^copy pools|^calls: |^spread|^per kernel|^host time" "$@"; }
# A dispatch record at H = 7168 bf16, top-8: 14336 B of row, 32 of weights, 64 of i64
# indices and 16 of source (4, padded; the "B each" of the writes line says what ran).
rec=14448
if [ "${LEGS_TESTS:-1}" = 1 ]; then
  ep_tests "$lg_log" legs
  logged "$lg_log" 300 6 "^$" "the copy pool's ordered-copy GPU tests" "$B/gpu" --ignored --test-threads=1 copy_pool
fi
# LEGS_PREV=1: each EP run also with the earlier build ($B/bench_dispatch_combine_prev, carried
# beside the bundle; one that takes --zero-token-ranks and --remote-only-ranks on GPUs), in
# alternating order.
prev=""
[ "${LEGS_PREV:-0}" = 1 ] && ep_prev "$lg_log"
order() { if [ -z "$prev" ]; then echo n; elif [ $(($1 % 2)) = 1 ]; then echo pn; else echo np; fi; }
leg1() { echo --world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5; }
for round in 1 2; do
  for t in 32 128 512; do
    step "legs: round $round: T = $t, the leg alone against bench_engine at $((t * rec)) B"
    ep_ab lgl "$prev" "async_ll 2x1 leg alone T=$t ($round)" "$(order $round)" --kernel-type async_ll \
      --num-tokens "$t" --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16 $(leg1)
    logged "$lg_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * rec)) B ($round)" "$B/bench_engine" --local \
      --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --buffer-size $((t * rec)) \
      --iters 200 --warmup-iters 20 --log-level warning
  done
done
step "legs: V1 and V1-LL, the leg alone, T = 128"
round=0
for kt in v1 v1_ll; do
  round=$((round + 1))
  ep_ab lgl "$prev" "$kt 2x1 leg alone T=128" "$(order $round)" --kernel-type "$kt" $EP_DEC $(leg1)
done
step "legs: 2 x 4 decode over xgmi, the three schemes"
round=0
for kt in async_ll v1 v1_ll async_ll; do
  round=$((round + 1))
  ep_ab lgl "$prev" "$kt decode xgmi" "$(order $round)" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
step "legs: the targets' baselines"
ep_targets "$lg_log" $EP_DEC
