# Paged KV-cache transfers (issue 18): bench_engine --paged on xgmi and fabric, two processes
# on GPU 0, read and write, for the issue's four shapes, each against the same-run contiguous
# transfer of the same bytes (and, on xgmi, the same-run bare device copy: --copy-baseline);
# then bench_copy --ipc of the same totals as one contiguous copy (the stop-and-wait copy the
# ratios are read against for fabric). A fragment sourced by scripts/gpu-machine.sh (B, OUT,
# step, logged, rc). PAGED_ITERS iterations per point (default 100).
paged_log="$OUT/paged.txt"
# name block-size num-blocks layers: 16384 x 32 KiB, 4096 x 32 KiB, 4096 x 4 KiB (32 layers x
# K/V x N table entries), 128 x 64 KiB (1 layer x K/V x 64).
paged_shapes=("16384x32KiB 32768 256 32" "4096x32KiB 32768 64 32" "4096x4KiB 4096 64 32" "128x64KiB 65536 64 1")
paged_common=(--local --mem-type gpu --enable-sess --paged --iters "${PAGED_ITERS:-100}" --warmup-iters 10 --log-level warning)
step "paged batches: xgmi (with the bare-copy baseline) and fabric, two processes on GPU 0"
for shape in "${paged_shapes[@]}"; do
  read -r name bs nb layers <<<"$shape"
  for op in write read; do
    logged "$paged_log" 120 4 '^$' "xgmi paged $op $name" "$B/bench_engine" --backend xgmi --op "$op" --copy-baseline \
      --block-size "$bs" --num-blocks "$nb" --layers "$layers" "${paged_common[@]}"
    logged "$paged_log" 120 3 '^$' "fabric paged $op $name" "$B/bench_engine" --backend fabric --op "$op" \
      --block-size "$bs" --num-blocks "$nb" --layers "$layers" "${paged_common[@]}"
  done
done
step "bench_copy --ipc: one contiguous copy of each shape's total bytes (stop-and-wait)"
for total in 536870912 134217728 16777216 8388608; do
  logged "$paged_log" 120 3 '^$' "bench_copy --ipc $total B" "$B/bench_copy" --ipc --gpu 0 --sweep-start "$total" --sweep-max "$total" \
    --iters 100 --warmup-iters 10
done
