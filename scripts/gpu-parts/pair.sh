# Batch-1 latency against the in-run bare copy (bench_engine --copy-baseline: blocks of
# engine transfers alternate with blocks of bare copies between the same two buffers, in the
# same process), then the same per NUMA node of the machine (taskset to the node's CPUs) to
# see whether thread placement moves either. Also the GPU tests of the crates whose code the
# transfer path runs through (mori-gpu, xgmi, fabric). A fragment sourced by
# scripts/gpu-machine.sh (B, OUT, step, logged, rc); PAIR_ROUNDS rounds (default 2).
pair_log="$OUT/pair.txt"
# size, engine µs, in-run copy µs, ratio
pair_run() {
  local name=$1
  shift
  table_rows "$pair_log" "$name" '$1, $5, $7, $8' "$@"
}
pair_sweep=(--backend xgmi --mem-type gpu --enable-sess --transfer-batch-size 1 --all --sweep-start 8 --sweep-max 65536 --iters 1000 --warmup-iters 100 --log-level warning --copy-baseline)
step "GPU tests: mori-gpu, xgmi, fabric"
for t in gpu xgmi_gpu fabric_gpu; do
  timeout 300 "$B/$t" --ignored --nocapture --test-threads=1 >>"$OUT/tests.log" 2>&1 || { echo "FAILED: $t"; rc=1; }
  grep -E "test result" "$OUT/tests.log" | tail -n 1
done
step "placement: NUMA nodes, GPU 0's CPU affinity"
nvidia-smi topo -m 2>&1 | head -n 4
for n in /sys/devices/system/node/node[0-9]*; do echo "$(basename "$n"): cpus $(cat "$n/cpulist")"; done
for r in $(seq 1 "${PAIR_ROUNDS:-2}"); do
  step "batch-1 latency with the in-run copy baseline, round $r"
  for op in write read; do
    pair_run "xgmi $op two processes r$r" "$B/bench_engine" --local --op "$op" "${pair_sweep[@]}"
    pair_run "xgmi $op one process r$r" "$B/bench_engine" --xgmi-single-process --op "$op" "${pair_sweep[@]}"
  done
done
step "the same per NUMA node (taskset), read and write, two processes"
for n in /sys/devices/system/node/node[0-9]*; do
  cpus=$(cat "$n/cpulist")
  for op in write read; do
    pair_run "xgmi $op on $(basename "$n") ($cpus)" taskset -c "$cpus" "$B/bench_engine" --local --op "$op" "${pair_sweep[@]}"
  done
  table_rows "$pair_log" "bench_copy --ipc-src on $(basename "$n")" '$1, $3' \
    taskset -c "$cpus" "$B/bench_copy" --ipc-src --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
done
