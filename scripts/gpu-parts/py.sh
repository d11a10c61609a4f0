# mori_rs from Python on the GPU machine (issue 15): the wheel and nixl-cu13 from .whl/, the
# CPU pytest suite there, the two-process GPU flows (vLLM READ, SGLang multi-pair WRITE, torch
# CUDA tensors over xgmi, bytes checked), mori_rs.ops on 8 ranks (crates/py/bench/ops_gpu.py),
# then mori_rs and NIXL timed by the same harness
# (crates/py/bench/io_gpu.py) and the bare copies, then rounds of mori_rs against bench_engine
# at batch 1 (Python's cost per transfer); the
# comparison table last (crates/py/bench/compare.py). A fragment sourced by
# scripts/gpu-machine.sh (B, OUT, step, logged, rc).
py_log="$OUT/py.txt"
step "py: install the mori_rs wheel and nixl-cu13 (from .whl/, no index)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -n 3
# nixl-cu13's wheel (59 MB) travels unpacked and xz-compressed (32 MB) to fit the 64 MiB a
# call carries: `unzip` of the wheel into a folder, `tar -cJ` of it; unpacked here as pip would.
for t in .whl/*.site.tar.xz; do [ -f "$t" ] && tar -xJf "$t" -C /tmp/site; done
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import mori_rs.io, sys; print("mori_rs from", mori_rs.io.__file__, "python", sys.version.split()[0])' 2>&1 | tee -a "$py_log"
python3 -c 'import nixl_cu13' 2>/dev/null && echo "nixl_cu13 importable" | tee -a "$py_log"
# PY_SECTIONS picks (default all): flows (pytest, io_gpu.py check, ops_gpu.py), sweep (mori_rs,
# NIXL, copies), overhead (PY_ROUNDS alternating rounds against bench_engine, default 3).
PY_SECTIONS=${PY_SECTIONS:-flows sweep overhead}
py_has() { case " $PY_SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }
if py_has flows; then
step "py: the CPU pytest suite on this machine's Python"
logged "$py_log" 180 3 '^$' "pytest crates/py/tests" python3 -m pytest -q -p no:cacheprovider crates/py/tests
step "py: GPU flows (two processes on GPU 0, xgmi, torch CUDA tensors)"
logged "$py_log" 180 6 '^$' "io_gpu.py check" python3 crates/py/bench/io_gpu.py check
step "py: mori_rs.ops, 8 ranks (processes) on GPU 0: dispatch/combine against the reference, a CUDA graph, 10 replays"
logged "$py_log" 300 10 '^$' "ops_gpu.py (torch.distributed bootstrap)" python3 crates/py/bench/ops_gpu.py --world 8
logged "$py_log" 300 6 '^$' "ops_gpu.py (socket bootstrap)" python3 crates/py/bench/ops_gpu.py --world 4 --bootstrap socket
fi
if [ -f "$B/bench_engine.xz" ] && [ ! -x "$B/bench_engine" ]; then
  xz -dk "$B/bench_engine.xz" && chmod +x "$B/bench_engine"
fi
if py_has sweep; then
step "py: bandwidth sweep (mori_rs and NIXL through Python, bare copies)"
logged "$py_log" 240 4 '^$' "mori_rs" python3 crates/py/bench/io_gpu.py bench --impl mori_rs --json "$OUT/py-mori_rs.json"
logged "$py_log" 300 4 '^$' "nixl" python3 crates/py/bench/io_gpu.py bench --impl nixl --json "$OUT/py-nixl.json"
logged "$py_log" 120 2 '^$' "copy" python3 crates/py/bench/io_gpu.py copy --json "$OUT/py-copy.json"
fi
# Python's cost per batch-1 transfer: mori_rs (sess.write/read + Wait, up to 2000 iterations a
# point) and bench_engine (2000 iterations) alternating, PY_ROUNDS rounds (default 3).
if py_has overhead; then
for round in $(seq 1 "${PY_ROUNDS:-3}"); do
  step "py: batch-1 overhead against bench_engine, round $round"
  logged "$py_log" 120 8 '^$' "mori_rs batch-1" python3 crates/py/bench/io_gpu.py bench --impl mori_rs --sizes 8,4096,1048576,67108864 \
    --json "$OUT/py-ovh-mori_rs-$round.json"
  for op in write read; do
    logged "$py_log" 120 2 '^$' "bench_engine xgmi $op batch 1" "$B/bench_engine" --local --backend xgmi --mem-type gpu \
      --op "$op" --enable-sess --all --sweep-start 8 --sweep-max 67108864 --transfer-batch-size 1 --iters 2000 --warmup-iters 100 \
      --log-level warning --json "$OUT/py-ovh-be-$op-$round.json"
  done
done
fi
logged "$py_log" 60 80 '^$' "compare" python3 crates/py/bench/compare.py "$OUT" "${PY_ROUNDS:-3}"
# At most 8 files come back from the machine: the JSON rows travel as one archive.
tar czf "$OUT/py-json.tgz" -C "$OUT" $(cd "$OUT" && ls py-*.json) && rm -f "$OUT"/py-*.json
