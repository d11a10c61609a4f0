# Armed ordered-copy launches (mori_gpu::CopyPoolConfig::armed_depth, MORI_GPU_POOL_ARMED:
# posting an ordered batch writes its table and a doorbell into mapped host memory and makes
# no driver call): the copy pool's GPU tests, the armed ones among them (every byte of 24
# batches, the launch and fire counts, the order a host observer sees, a buffer freed once the
# pool is disarmed, the pool dropped), then bench_engine's batch-1 xgmi writes with the pool
# armed and not, in alternating order (no other work on the GPU). The inter-node EP refuses
# armed launches (`gpu_internode::refuse_armed_launches`: 0.9-1.2 ms a write under its load).
# A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/armed.txt.
# ARMED_ORDER the armed depths in turn (default "0220").
ar_log="$OUT/armed.txt"
step "armed: the copy pool's GPU tests"
logged "$ar_log" 300 12 "^$" "the copy pool's GPU tests" "$B/gpu" --ignored --test-threads=1 --nocapture copy_pool
step "armed: bench_engine batch-1 xgmi writes, armed and not"
for d in $(echo "${ARMED_ORDER:-0220}" | grep -o .); do
  logged "$ar_log" 120 8 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write, MORI_GPU_POOL_ARMED=$d" env MORI_GPU_POOL_ARMED="$d" \
    "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all \
    --sweep-start 8 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
done
