# xgmi on the GPU machine: the same-run baselines of issue 7's targets and the multi-GPU runs
# of issue 6. A fragment, sourced by scripts/gpu-machine.sh, which provides B (the bundle
# directory), OUT (the output directory), the function `step` and the status variable `rc`.
# Appends everything to $OUT/xgmi.txt and prints the tables. About 1-2 minutes.
#
# - bench_copy: one bare cuMemcpyDtoDAsync + event record + spin on the event (stop-and-wait:
#   the latency floor of a batch-1 transfer) and the same copies back to back (the bandwidth
#   roofline), 8 B..64 KiB and 4..64 MiB, on GPU 0 (and GPU 0 -> GPU 1 with two GPUs); the
#   same into another process's memory through an IPC mapping (--ipc), as the xgmi backend
#   copies between two processes.
# - bench_engine --backend xgmi at batch 1 with the same sizes, same process pair on GPU 0:
#   the ratio to bench_copy's stop-and-wait rows is the latency / bandwidth target; the same
#   with waiter-driven completion off (MORI_IO_CALLER_PROGRESS=0) and with one stream (A/B).
# - Batch 128 at 4..64 MiB: bench_copy --batch 128 (the same slots, copied back to back on one
#   stream, then one event waited for; local and --ipc) against bench_engine, two processes
#   and one.
# - With at least two GPUs: bench_engine between GPU 0 and GPU 1 (two processes, IPC over
#   NVLink), read and write 8 B..64 MiB at batch 1 and 128, validated; the same pair in one
#   process (--xgmi-single-process: peer access, no IPC); and --num-initiator-dev 2
#   --num-target-dev 2 (pairs GPU 0 <-> GPU 0 and GPU 1 <-> GPU 1, four processes) with the
#   [gpu N] rows and the [AGGREGATE] line.

xg_log="$OUT/xgmi.txt"
# xg NAME CMD...: runs CMD (2 minutes at most), appends its output to $xg_log, shows the
# table part, and sets rc=1 when it fails.
xg() { logged "$xg_log" 120 40 "^[0-9T:.-]+Z |^bench_engine: op|^note:" "$@"; }

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
xg_sweep=(--all --sweep-start 8 --sweep-max 67108864 --iters 1000 --warmup-iters 100 --log-level warning)

if [ -z "${ONLY_MULTI:-}" ]; then
step "xgmi: bare copy baseline on GPU 0 (stop-and-wait latency and back-to-back bandwidth)"
xg "bare copy GPU 0, 8 B..64 KiB" "$B/bench_copy" --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
xg_big() {
  xg "bare copy GPU 0, 4..64 MiB ($1)" "$B/bench_copy" --gpu 0 --sweep-start 4194304 --sweep-max 67108864 --iters 1000 --warmup-iters 100
  xg "bare copy GPU 0 into another process's memory (IPC), 4..64 MiB ($1)" "$B/bench_copy" --ipc --gpu 0 --sweep-start 4194304 \
    --sweep-max 67108864 --iters 1000 --warmup-iters 100
}
xg "bare copy GPU 0 into another process's memory (IPC), 8 B..64 KiB" "$B/bench_copy" --ipc --gpu 0 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
xg_big before

step "xgmi: bench_engine batch 1 on GPU 0 (two processes, IPC), same sizes, against the rows above"
for op in write read; do
  xg "xgmi $op b1 GPU 0 <-> GPU 0" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op "$op" --enable-sess \
    --transfer-batch-size 1 "${xg_sweep[@]}" --json "$OUT/xgmi-gpu0-$op-b1.json"
done
step "xgmi: the bare copies again (the engine's rows sit between the two)"
xg_big after

step "xgmi: A/B in the same run: completion by the backend's thread only (MORI_IO_CALLER_PROGRESS=0), and one stream"
for op in write read; do
  xg "xgmi $op b1 GPU 0, MORI_IO_CALLER_PROGRESS=0" env MORI_IO_CALLER_PROGRESS=0 "$B/bench_engine" --local --backend xgmi \
    --mem-type gpu --op "$op" --enable-sess --transfer-batch-size 1 "${xg_sweep[@]}"
done
xg "xgmi write b1 GPU 0, --num-streams 1" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess \
  --transfer-batch-size 1 --num-streams 1 "${xg_sweep[@]}"

step "xgmi: batch 128, 4..64 MiB: bare copies of bench_engine's batch layout (bench_copy --batch 128) against bench_engine"
xg_b128=(--all --sweep-start 4194304 --sweep-max 67108864 --transfer-batch-size 128 --iters 20 --warmup-iters 3 --log-level warning)
xg "bare copy GPU 0, batch 128, 4..64 MiB" "$B/bench_copy" --gpu 0 --batch 128 --sweep-start 4194304 --sweep-max 67108864 --iters 20 --warmup-iters 3
xg "bare copy GPU 0 (IPC), batch 128, 4..64 MiB" "$B/bench_copy" --ipc --gpu 0 --batch 128 --sweep-start 4194304 --sweep-max 67108864 --iters 20 --warmup-iters 3
for op in write read; do
  xg "xgmi $op b128 GPU 0 (two processes)" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op "$op" --enable-sess \
    "${xg_b128[@]}" --json "$OUT/xgmi-gpu0-$op-b128.json"
  xg "xgmi $op b128 GPU 0 (single process)" "$B/bench_engine" --xgmi-single-process --backend xgmi --mem-type gpu --op "$op" \
    --enable-sess "${xg_b128[@]}"
done

fi

if [ "$ngpu" -ge 2 ]; then
  step "xgmi: $ngpu GPUs; bare copy GPU 0 -> GPU 1"
  xg "bare copy GPU 0 -> GPU 1, 8 B..64 KiB" "$B/bench_copy" --gpu 0 --dst-gpu 1 --sweep-start 8 --sweep-max 65536 --iters 2000 --warmup-iters 200
  xg "bare copy GPU 0 -> GPU 1, 4..64 MiB" "$B/bench_copy" --gpu 0 --dst-gpu 1 --sweep-start 4194304 --sweep-max 67108864 --iters 200 --warmup-iters 20

  step "xgmi: bench_engine GPU 0 -> GPU 1, two processes (IPC over NVLink), read and write, batch 1 and 128"
  for op in write read; do
    xg "xgmi $op b1 GPU 0 -> GPU 1" "$B/bench_engine" --local --backend xgmi --mem-type gpu --gpu 0 --target-dev-offset 1 \
      --op "$op" --enable-sess --transfer-batch-size 1 "${xg_sweep[@]}" --json "$OUT/xgmi-gpu01-$op-b1.json"
    xg "xgmi $op b128 GPU 0 -> GPU 1" "$B/bench_engine" --local --backend xgmi --mem-type gpu --gpu 0 --target-dev-offset 1 \
      --op "$op" --enable-sess --transfer-batch-size 128 --all --sweep-start 8 --sweep-max 67108864 --iters 20 --warmup-iters 3 \
      --log-level warning --json "$OUT/xgmi-gpu01-$op-b128.json"
  done

  step "xgmi: GPU 0 -> GPU 1 in one process (--xgmi-single-process: peer access, no IPC), write batch 1"
  xg "xgmi single process write b1 GPU 0 -> GPU 1" "$B/bench_engine" --xgmi-single-process --backend xgmi --mem-type gpu \
    --src-gpu 0 --dst-gpu 1 --op write --enable-sess --transfer-batch-size 1 "${xg_sweep[@]}"

  step "xgmi: --num-initiator-dev 2 --num-target-dev 2 (pairs GPU 0 <-> 0 and 1 <-> 1, four processes)"
  for op in write read; do
    xg "xgmi $op two pairs b1" "$B/bench_engine" --local --backend xgmi --mem-type gpu --num-initiator-dev 2 --num-target-dev 2 \
      --op "$op" --enable-sess --transfer-batch-size 1 "${xg_sweep[@]}" --json "$OUT/xgmi-pairs-$op-b1.json"
  done
else
  step "xgmi: $ngpu GPU(s): the GPU 0 <-> GPU 1 runs and --num-initiator-dev 2 need two GPUs; not run"
fi
