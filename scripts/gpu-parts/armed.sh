# Armed ordered-copy launches (mori_gpu::CopyPoolConfig::armed_depth: posting an ordered batch
# writes its table and a doorbell into mapped host memory and makes no driver call): the copy
# pool's GPU tests, the armed ones among them (every byte of 23 batches, the launch and fire
# counts, the order a host observer sees, the pool dropped with launches armed). A fragment,
# sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/armed.txt.
ar_log="$OUT/armed.txt"
step "armed: the copy pool's GPU tests"
logged "$ar_log" 300 12 "^$" "the copy pool's GPU tests" "$B/gpu" --ignored --test-threads=1 --nocapture copy_pool
