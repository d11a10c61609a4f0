# The dispatch staging's hand-over ordered at device scope and released to the proxy by the ring
# push's one system fence, against the build before it ($B/bench_dispatch_combine_mid: the
# relay's sums checking the node's ranks one thread a rank) and the fan-out build
# ($B/bench_dispatch_combine_prev, fan.sh's): fan.sh's steps, logged to $OUT/fences.txt, the
# V1-LL traces kept as $OUT/fences-v1_ll.rankR.json. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc).
FAN_NAME=fences
# shellcheck source=scripts/gpu-parts/fan.sh
. scripts/gpu-parts/fan.sh
