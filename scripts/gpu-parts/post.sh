# Where the inter-node proxies' posting time goes, 2 nodes x 4 ranks on one GPU, decode shape.
# A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/post.txt.
# About 2 minutes on one H100/H200.
#
# Each bench_dispatch_combine run prints the proxies' mean posting call, the copy pools'
# split of a submission (slot wait, the driver calls that queue the copies, the event record),
# the completion steps' event queries, and the cores the process kept busy. Runs: V1 and
# AsyncLL over xgmi as configured; the same with the copy pools' completion threads yielding
# instead of spinning (MORI_GPU_POOL_SPIN=0); V1 at 2 and 4 ranks (how the posting call grows
# with the number of engines); V1 on 8 of the machine's cores (how it depends on free cores).
po_log="$OUT/post.txt"
po() { logged "$po_log" 200 14 "^$|^rank " "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "post: V1 and AsyncLL decode over xgmi, as configured"
po "v1 decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --json "$OUT/post-v1.json"
po "async_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --json "$OUT/post-asyncll.json"
step "post: the same with the copy pools' completion threads yielding (MORI_GPU_POOL_SPIN=0)"
po "v1 decode xgmi, pools yield" env MORI_GPU_POOL_SPIN=0 "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --json "$OUT/post-v1-yield.json"
po "async_ll decode xgmi, pools yield" env MORI_GPU_POOL_SPIN=0 "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --json "$OUT/post-asyncll-yield.json"
step "post: V1 at 2 and 4 ranks, and on 8 cores"
po "v1 decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 --world-size 2 $dec
po "v1 decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 --world-size 4 $dec
po "v1 decode xgmi, cores 0-7" taskset -c 0-7 "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
