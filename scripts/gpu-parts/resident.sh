# The copy pool's resident copier (MORI_GPU_POOL_RESIDENT=<blocks>: a grid that stays on the
# device and runs the proxies' ordered batches as they are written into mapped host memory, no
# launch per post) against the ordered-copy kernel launched per post (the default, same
# binary), alternating: mori-gpu's resident-copier test, then the leg alone (2 x 1, rank 0
# routing every token to node 1) at T = 32, 128 and 512 in two rounds beside bench_engine's
# batch-1 xgmi write of the dispatch write's size (post and wait split), the 2 x 4 decode rows
# of the three schemes, the inter-node EP GPU tests with the copier and without, and the
# targets' baselines. After a failed run with the copier the later ones are skipped. A
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to
# $OUT/resident.txt. RES_LEG and RES_DEC set the copier's blocks for the leg alone (two grids)
# and for 2 x 4 (eight grids). Each copier run is made twice: with the default shared-memory
# split (the largest) and with the driver's (MORI_GPU_POOL_RESIDENT_CARVEOUT=-1).
rs_log="$OUT/resident.txt"
# 60 s a bench (a stalled copier should not eat the run).
rsl() { logged "$rs_log" 60 14 "$EP_RUN_DROP|^calls: |^spread|^host time" "$@"; }
rs_leg_blocks=${RES_LEG:-96}
rs_dec_blocks=${RES_DEC:-24}
rs_rec=14448
logged "$rs_log" 60 6 "^$" "mori-gpu resident copier" "$B/gpu" --ignored --test-threads=1 copy_pool_resident
# rs_ab NAME ORDER BLOCKS ARGS...: bench_dispatch_combine ARGS --device-api once per letter of
# ORDER: l launched per post (MORI_GPU_POOL_RESIDENT=0), r the copier of BLOCKS blocks, d the
# same with the driver's shared-memory split.
rs_ab() {
  local name=$1 order=$2 blocks=$3 x v c
  shift 3
  for x in $(echo "$order" | grep -o .); do
    c=100
    case $x in
      l) v=0 ;;
      r) v=$blocks ;;
      d) v=$blocks c=-1 ;;
    esac
    if [ "$x" != l ] && [ "$rs_bad" = 1 ]; then
      echo "--- $name, MORI_GPU_POOL_RESIDENT=$v MORI_GPU_POOL_RESIDENT_CARVEOUT=$c: skipped (an earlier run with the copier failed)" | tee -a "$rs_log"
      continue
    fi
    local before=$rc
    rc=0
    rsl "$name, MORI_GPU_POOL_RESIDENT=$v MORI_GPU_POOL_RESIDENT_CARVEOUT=$c" env MORI_GPU_POOL_RESIDENT=$v \
      MORI_GPU_POOL_RESIDENT_CARVEOUT=$c "$B/bench_dispatch_combine" "$@" --device-api
    [ "$x" != l ] && [ "$rc" != 0 ] && rs_bad=1
    [ "$before" != 0 ] && rc=$before
  done
}
rs_bad=0
rs_leg="--world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5"
for round in 1 2; do
  ord=lrd
  [ "$round" = 2 ] && ord=drl
  for t in 32 128 512; do
    step "resident: round $round: T = $t, the leg alone against bench_engine at $((t * rs_rec)) B"
    # shellcheck disable=SC2086
    rs_ab "async_ll 2x1 leg alone T=$t ($round)" "$ord" "$rs_leg_blocks" --kernel-type async_ll --num-tokens "$t" --hidden 7168 \
      --num-experts 256 --top-k 8 --dtype bf16 $rs_leg
    logged "$rs_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * rs_rec)) B ($round)" env MORI_BENCH_SPLIT=1 \
      "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 \
      --buffer-size $((t * rs_rec)) --iters 200 --warmup-iters 20 --copy-baseline --log-level warning
  done
done
step "resident: V1 and V1-LL, the leg alone, T = 128"
# shellcheck disable=SC2086
rs_ab "v1 2x1 leg alone T=128" lrd "$rs_leg_blocks" --kernel-type v1 $EP_DEC $rs_leg
# shellcheck disable=SC2086
rs_ab "v1_ll 2x1 leg alone T=128" drl "$rs_leg_blocks" --kernel-type v1_ll $EP_DEC $rs_leg
step "resident: 2 x 4 decode over xgmi, the three schemes"
round=0
for kt in v1_ll async_ll v1 v1_ll; do
  round=$((round + 1))
  ord=lrd
  [ $((round % 2)) = 0 ] && ord=drl
  # shellcheck disable=SC2086
  rs_ab "$kt decode xgmi ($round)" "$ord" "$rs_dec_blocks" --kernel-type "$kt" --num-nodes 2 $EP_DEC
done
step "resident: inter-node EP GPU tests with the copier ($rs_dec_blocks blocks)"
logged "$rs_log" 150 20 "^$" "ep internode GPU tests, MORI_GPU_POOL_RESIDENT=$rs_dec_blocks" env MORI_GPU_POOL_RESIDENT=$rs_dec_blocks "$B/ep_internode_gpu" --ignored --test-threads=1
ep_tests "$rs_log" resident
step "resident: the targets' baselines"
# shellcheck disable=SC2086
ep_targets "$rs_log" $EP_DEC
