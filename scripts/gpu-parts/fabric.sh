# Fabric backend on the GPU machine: a bash fragment sourced by scripts/gpu-machine.sh, which
# defines B (the bundle folder), OUT, step and rc. The whole fragment stops within 110 s
# (each command gets what is left of that; a command cut off counts as a failure).
fab_end=$((SECONDS + 110))
fab_left() { local l=$((fab_end - SECONDS)); [ "$l" -gt 1 ] && echo "$l" || echo 1; }
step "fabric backend tests (two processes on one GPU via POSIX-FD handles; FABRIC diagnosis)"
timeout "$(fab_left)" "$B/fabric_gpu" --ignored --nocapture --test-threads=1 >"$OUT/fabric-tests.log" 2>&1 || rc=1
grep -E "^test |test result|FABRIC handles|refused" "$OUT/fabric-tests.log" | tail -n 8
cat "$OUT/fabric-tests.log" >>"$OUT/tests.log"
step "bench_engine --local --backend fabric --mem-type gpu (POSIX FD, two processes on GPU 0), 8 B .. 64 MiB"
for op in write read; do
  for b in 1 128; do
    echo "--- fabric, op $op, batch $b"
    timeout "$(fab_left)" "$B/bench_engine" --local --backend fabric --mem-type gpu --op "$op" --enable-sess --all \
      --sweep-start 8 --sweep-max 67108864 --transfer-batch-size "$b" --iters 20 --warmup-iters 3 \
      --log-level warning --json "$OUT/fabric-$op-b$b.json" 2>&1 | tee -a "$OUT/bench.txt" | tail -n 30
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
done
