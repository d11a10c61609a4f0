# Armed ordered-copy launches (mori_gpu::CopyPoolConfig::armed_depth, MORI_GPU_POOL_ARMED:
# posting an ordered batch writes its table and a doorbell into mapped host memory and makes
# no driver call): the copy pool's GPU tests, the armed ones among them (every byte of 24
# batches, the launch and fire counts, the order a host observer sees, a buffer freed once the
# pool is disarmed, the pool dropped). Nothing else here posts ordered batches: bench_engine's
# and bench_proxy's xgmi writes are plain copies (bench_proxy's "copy pools" line counts 0
# ordered launches and 0 armed fires), and the inter-node EP, which does, refuses armed launches
# (`gpu_internode::refuse_armed_launches`: 0.9-2.8 ms a write under its co-resident grids). A
# fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/armed.txt.
ar_log="$OUT/armed.txt"
step "armed: the copy pool's GPU tests"
logged "$ar_log" 300 12 "^$" "the copy pool's GPU tests" "$B/gpu" --ignored --test-threads=1 --nocapture copy_pool
