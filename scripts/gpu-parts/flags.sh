# Whether the copy pools' completion flags (MORI_GPU_POOL_FLAGS=1) should be the default (they
# are since this ran): a
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/flags.txt.
#
# Alternating rounds, events (MORI_GPU_POOL_FLAGS=0) then flags, in one call: bench_engine xgmi batch-1
# writes (latency, 8 B .. 4 MiB) twice, reads once, batch-128 writes once (bandwidth,
# 64 KiB .. 64 MiB); V1 decode at 2 x 4 twice, V1-LL and AsyncLL decode once; then the
# correctness of the flag path under load: the xgmi backend's and the inter-node EP's GPU
# tests with flags on.
fl_log="$OUT/flags.txt"
fl() { logged "$fl_log" 200 26 "^$|^rank |^│|^┌|^└|^├|^[0-9T:.-]+Z " "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
be=("$B/bench_engine" --local --backend xgmi --mem-type gpu --enable-sess --all --log-level warning)
for run in "write 1" "write 2" "read 1"; do
  read -r op n <<<"$run"
  step "flags: bench_engine xgmi batch-1 $op ($n), events then flags"
  events_then_flags fl "bench_engine $op b1 ($n)" - "${be[@]}" --op "$op" --transfer-batch-size 1 --sweep-start 8 --sweep-max 4194304 --iters 200 --warmup-iters 20
done
step "flags: bench_engine xgmi batch-128 writes, events then flags"
events_then_flags fl "bench_engine write b128" - "${be[@]}" --op write --transfer-batch-size 128 --sweep-start 65536 --sweep-max 67108864 --iters 20 --warmup-iters 3
for round in 1 2; do
  step "flags: round $round: V1 decode 2 x 4 over xgmi, events then flags"
  events_then_flags fl "v1 decode ($round)" "$OUT/flags-v1-$round" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
done
step "flags: V1-LL and AsyncLL decode 2 x 4 over xgmi, events then flags"
for kt in v1_ll async_ll; do
  events_then_flags fl "$kt decode" "$OUT/flags-$kt" "$B/bench_dispatch_combine" --kernel-type $kt --num-nodes 2 $dec
done
step "flags: GPU tests with flags on (xgmi backend, inter-node EP)"
fl "xgmi GPU tests, flags" env MORI_GPU_POOL_FLAGS=1 "$B/xgmi_gpu" --ignored --test-threads=1
fl "ep inter-node GPU tests, flags" env MORI_GPU_POOL_FLAGS=1 "$B/ep_internode_gpu" --ignored --test-threads=1
