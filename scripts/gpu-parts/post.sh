# Where the inter-node proxies' posting time goes, 2 nodes x 4 ranks on one GPU, decode shape,
# and what the copy pools' completion flags change. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/post.txt. 16 commands, each
# cut off at 200 s; the whole part took 45 s on an H200.
#
# Each bench_dispatch_combine run prints the proxies' mean posting call, the copy pools'
# split of a submission (slot wait, the driver calls that queue the copies, the flag write
# and event record), the completion steps' event queries, and the cores the process kept
# busy. Runs: the copy pool's GPU test (events, then flags); V1 over xgmi with completion
# told by events (MORI_GPU_POOL_FLAGS=0), then by flags (MORI_GPU_POOL_FLAGS=1, the default
# since), twice, alternating;
# AsyncLL and V1 at 2 ranks the same way, once; V1 with the completion threads yielding
# (MORI_GPU_POOL_SPIN=0, events); V1 with flags at 16 and 32 copy-out blocks per rank (default 64); then
# bench_engine xgmi batch-1 writes, events against flags; last, a traced V1-LL run and its analysis.
po_log="$OUT/post.txt"
po() { logged "$po_log" 200 24 "^$|^rank |^│|^┌|^└|^├" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "post: the copy pool's GPU test (completion by events, then by flags)"
po "copy pool test" "$B/gpu" --ignored --exact pool::copy_pool_copies_and_survives_a_panicking_callback --nocapture
for round in 1 2; do
  step "post: round $round: V1 decode over xgmi, events then flags"
  events_then_flags po "v1 decode xgmi ($round)" "$OUT/post-v1-$round" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
done
step "post: AsyncLL decode over xgmi, events then flags; V1 at 2 ranks, events then flags"
events_then_flags po "async_ll decode xgmi" "$OUT/post-asyncll" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
events_then_flags po "v1 decode xgmi W=2" - "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 --world-size 2 $dec
step "post: V1 with the completion threads yielding (MORI_GPU_POOL_SPIN=0)"
po "v1 decode xgmi, pools yield" env MORI_GPU_POOL_SPIN=0 MORI_GPU_POOL_FLAGS=0 "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
step "post: V1 with another copy-out grid (--copy-blocks 16, 32; default 64), flags"
po "v1 decode xgmi, flags, copy-blocks 16" env MORI_GPU_POOL_FLAGS=1 "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --copy-blocks 16
po "v1 decode xgmi, flags, copy-blocks 32" env MORI_GPU_POOL_FLAGS=1 "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --copy-blocks 32
step "post: bench_engine xgmi batch-1 writes (two processes), events then flags"
events_then_flags po "bench_engine xgmi" - "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 8 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
step "post: V1-LL decode over xgmi, traced (relay forwarding and relay reduce in their own spans), flags"
mkdir -p "$OUT/trace"
po "v1_ll decode xgmi traced, flags" env MORI_GPU_POOL_FLAGS=1 "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec --trace "$OUT/trace/post-v1ll.json"
po "trace analyze v1_ll rank 0" "$B/mori" trace analyze "$OUT/trace/post-v1ll.rank0.json" --out "$OUT/trace/post-v1ll.rank0.png"
