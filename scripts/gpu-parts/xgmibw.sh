# xgmi batch-1 bandwidth at 4..64 MiB, the issue-7 target, measured as alternating rounds: in
# each round the bare copies (bench_copy stop-and-wait, local and --ipc), then bench_engine
# --backend xgmi write and read (two processes on GPU 0; with --copy-baseline, so each row
# also carries the bare copy between the same buffers, timed in alternating blocks, and the
# engine's ratio to it), then the bare copies once more
# after the last round. A fragment sourced by scripts/gpu-machine.sh (B, OUT, step, logged,
# rc); BW_ROUNDS (or ROUNDS, its earlier name; default 3) rounds, about 20 s each. Everything goes to $OUT/xgmi-bw.txt; the
# console shows the table rows only.
xb_log="$OUT/xgmi-bw.txt"
xb() { logged "$xb_log" 120 6 "^[0-9T:.-]+Z |^bench_engine: op|^bench_copy: |^note:|^validation|MsgSize|BlockSize" "$@"; }
xb_bare() {
  xb "bare copy GPU 0, 4..64 MiB ($1)" "$B/bench_copy" --gpu 0 --sweep-start 4194304 --sweep-max 67108864 --iters 2000 --warmup-iters 100
  xb "bare copy GPU 0 (IPC), 4..64 MiB ($1)" "$B/bench_copy" --ipc --gpu 0 --sweep-start 4194304 --sweep-max 67108864 --iters 2000 --warmup-iters 100
}
for r in $(seq 1 "${BW_ROUNDS:-${ROUNDS:-3}}"); do
  step "xgmi batch-1 bandwidth, round $r"
  xb_bare "round $r"
  for op in write read; do
    xb "xgmi $op b1 4..64 MiB (round $r)" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op "$op" --enable-sess \
      --transfer-batch-size 1 --all --sweep-start 4194304 --sweep-max 67108864 --iters 2000 --warmup-iters 100 --log-level warning --copy-baseline
  done
done
step "xgmi batch-1 bandwidth, closing bare copies"
xb_bare "closing"
