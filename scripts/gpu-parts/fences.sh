# The dispatch staging's hand-over ordered at device scope and released to the proxy by the ring
# push's one system fence, against the build before it ($B/bench_dispatch_combine_mid: the
# relay's sums checking the node's ranks one thread a rank) and the fan-out build
# ($B/bench_dispatch_combine_prev, fan.sh's): fan.sh's steps, logged to $OUT/fences.txt, the
# V1-LL traces kept as $OUT/fences-v1_ll.rankR.json; then this build's decode over xgmi with
# twice the co-resident warps per rank (16 warps a block, or 32 blocks a rank, which the
# bench refuses on a GPU of fewer than 256 multiprocessors: its co-resident grid must fit). A
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc).
FAN_NAME=fences
# shellcheck source=scripts/gpu-parts/fan.sh
. scripts/gpu-parts/fan.sh
for kt in v1_ll v1 async_ll; do
  step "fences: $kt decode xgmi, 16 warps a block"
  fnl "$kt decode xgmi, 16 warps a block, this build" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $EP_DEC --device-api --warps-per-block 16
  step "fences: $kt decode xgmi, 32 blocks a rank"
  fnl "$kt decode xgmi, 32 blocks a rank, this build" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $EP_DEC --device-api --block-num 32
done
