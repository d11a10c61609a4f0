# Batch-1 latency, 8 B..64 KiB, in alternating rounds: bench_copy stop-and-wait (local, into
# another process's memory through IPC = the write direction, and from it = the read
# direction), then bench_engine --local --backend xgmi and fabric, write and read (two
# processes on GPU 0),
# LAT_ROUNDS rounds (default 2), then the bare copy once more. A fragment sourced by
# scripts/gpu-machine.sh (B, OUT, step, logged, rc); about 10 s a round. Everything goes to
# $OUT/lat.txt; the console shows each run's rows on one line (size, iterations, GB/s, µs).
lat_log="$OUT/lat.txt"
# size, µs, GB/s (bench_engine: size, iterations, GB/s, µs)
lat_run() {
  local name=$1
  shift
  table_rows "$lat_log" "$name" '$1, $3, $4, $5' "$@"
}
lat_sweep=(--all --sweep-start 8 --sweep-max 65536 --iters 1000 --warmup-iters 100 --log-level warning)
for r in $(seq 1 "${LAT_ROUNDS:-2}"); do
  step "batch-1 latency, round $r"
  lat_run "bare copy r$r" "$B/bench_copy" --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
  lat_run "bare copy into IPC r$r" "$B/bench_copy" --ipc --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
  lat_run "bare copy from IPC r$r" "$B/bench_copy" --ipc-src --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
  for be in xgmi fabric; do
    for op in write read; do
      lat_run "$be $op b1 r$r" "$B/bench_engine" --local --backend "$be" --mem-type gpu --op "$op" --enable-sess --transfer-batch-size 1 "${lat_sweep[@]}"
    done
  done
done
lat_run "bare copy closing" "$B/bench_copy" --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
