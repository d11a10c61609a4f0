# Where the leg alone's wait goes (2 x 1, rank 0 routing every token to node 1, AsyncLL): the
# ordered batch as one launch of the ordered-copy kernel (the default) against two copies on
# the copy engines (MORI_GPU_POOL_ORDERED_KERNEL=0: the segment, then the counter pair, on one
# stream), at T = 32, 128 and 512 in alternating order, each size beside bench_engine's
# batch-1 xgmi write with its posting and waiting split (MORI_BENCH_SPLIT); the kernel path
# with 16 co-resident blocks a rank instead of 64 (fewer spinning warps beside the copy); and
# V1 and AsyncLL decode at 2 x 4 both ways. A fragment, sourced by scripts/gpu-machine.sh (B,
# OUT, step, rc); appends to $OUT/legwait.txt. About 2 minutes on one H100.
lw_log="$OUT/legwait.txt"
lwl() { ep_logged "$lw_log" 8 "^calls: |^spread|^per kernel|^host time|^│|^┌|^╞|^└|^rank|^times|^mori_ep|^check|^bench_dispatch" "$@"; }
lw_rec=14448
lw_leg="--world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5"
# lw_ab NAME ORDER ARGS...: ORDER's 1 the ordered-copy kernel, 0 the copy engines.
lw_ab() { ep_env_ab lwl "$1" "$2" MORI_GPU_POOL_ORDERED_KERNEL "${@:3}"; }
for t in 32 128 512; do
  step "legwait: T = $t, the leg alone: kernel against copy engines, and bench_engine at $((t * lw_rec)) B"
  # shellcheck disable=SC2086
  lw_ab "async_ll 2x1 leg alone T=$t" 1001 --kernel-type async_ll --num-tokens "$t" --hidden 7168 --num-experts 256 \
    --top-k 8 --dtype bf16 $lw_leg
  logged "$lw_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * lw_rec)) B" env MORI_BENCH_SPLIT=1 \
    "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 \
    --buffer-size $((t * lw_rec)) --iters 200 --warmup-iters 20 --copy-baseline --log-level warning
done
step "legwait: the leg alone at T = 128 with 16 co-resident blocks a rank"
# shellcheck disable=SC2086
lw_ab "async_ll 2x1 leg alone T=128, 16 blocks" 1 --kernel-type async_ll $EP_DEC $lw_leg --block-num 16
step "legwait: 2 x 4 decode over xgmi, kernel against copy engines"
for kt in async_ll v1; do
  # shellcheck disable=SC2086
  lw_ab "$kt decode xgmi" 10 --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
