# MORI-EP AsyncLL, V1-LL and V1 across 2 nodes x 4 ranks on one GPU, with their same-run baselines.
# A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to
# $OUT/asyncll.txt. About 6 minutes on one H100/H200.
#
# - the inter-node GPU tests (AsyncLL, V1-LL and V1, xgmi and tcp legs, bit-exact against the
#   reference);
# - bench_dispatch_combine --kernel-type async_ll at the decode shape (T=128, H=7168, E=256,
#   K=8, bf16) over xgmi, with --trace (one Perfetto file per rank, read by mori trace
#   analyze), also at 2 and 4 ranks; over tcp; and the DeepSeek-V3 shape (T=4096, fp8); the
#   same with --kernel-type v1_ll and v1 (decode over xgmi traced, over tcp, V3);
# - the baselines the targets name, in the same run: bench_engine at the legs' message sizes
#   (xgmi and tcp), the put-with-signal round trip through
#   the ring and proxy at the leg's message size (bench_proxy: one decode segment is about 84
#   records of 14448 B, 1.2 MB), the intranode kernels for the same shape and ranks, and
#   PyTorch for context (scripts/ep_torch_baseline.py --mode single: 8 logical ranks on the
#   GPU; its NCCL mode needs a GPU per rank).
al_log="$OUT/asyncll.txt"
al() { logged "$al_log" 300 40 "^$" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "asyncll: GPU tests (AsyncLL, V1-LL and V1, 2 nodes x 4 ranks, xgmi and tcp legs, bit-exact)"
al "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --nocapture --test-threads=1
step "asyncll: decode over xgmi, traced"
mkdir -p "$OUT/trace"
al "async_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$OUT/trace/decode-xgmi.json"
al "trace analyze rank 0" "$B/mori" trace analyze "$OUT/trace/decode-xgmi.rank0.json" --out "$OUT/trace/decode-xgmi.rank0.png"
al "trace analyze rank 4" "$B/mori" trace analyze "$OUT/trace/decode-xgmi.rank4.json" --out "$OUT/trace/decode-xgmi.rank4.png"
step "asyncll: decode over xgmi at 2 and 4 ranks (1 and 2 per node): how the leg scales"
al "async_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec --trace "$OUT/trace/decode-xgmi-w2.json"
al "async_ll decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec --trace "$OUT/trace/decode-xgmi-w4.json"
step "asyncll: decode over tcp (4 lanes), traced"
al "async_ll decode tcp" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2 --trace "$OUT/trace/decode-tcp.json"
step "asyncll: DeepSeek-V3 shape over xgmi (fp8), traced"
al "async_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2 --trace "$OUT/trace/v3-xgmi.json"
step "asyncll: V1-LL decode over xgmi (traced) and tcp, V3 over xgmi"
al "v1_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec --trace "$OUT/trace/v1ll-decode-xgmi.json"
al "trace analyze v1_ll rank 0" "$B/mori" trace analyze "$OUT/trace/v1ll-decode-xgmi.rank0.json" --out "$OUT/trace/v1ll-decode-xgmi.rank0.png"
al "v1_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 --world-size 2 $dec
al "v1_ll decode tcp" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2
al "v1_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "asyncll: V1 decode over xgmi (traced) and tcp, V3 over xgmi"
al "v1 decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --trace "$OUT/trace/v1-decode-xgmi.json"
al "v1 decode tcp" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2
al "v1 V3 xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "asyncll: baselines: put-with-signal round trip through ring and proxy (xgmi, tcp), intranode kernels"
al "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
al "bench_proxy tcp" "$B/bench_proxy" --transport tcp --sizes 8,1213632 --iters 50 --flood-bytes 0
# The transports' own rates at the legs' message sizes (one decode segment 1.2 MB; a V1-LL relay
# segment up to 4x that), for the leg-rate target (>= 0.9x bench_engine).
al "bench_engine xgmi write, leg sizes" "$B/bench_engine" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 262144 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
al "bench_engine tcp write, leg sizes" "$B/bench_engine" --local --backend tcp --mem-type cpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 262144 --sweep-max 4194304 --iters 50 --warmup-iters 5 --log-level warning
al "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
al "torch baseline, decode, 8 logical ranks on one GPU" python3 scripts/ep_torch_baseline.py --mode single --world 8 --tokens 128 --hidden 7168 --experts 256 --topk 8 --dtype bf16
# One archive for the per-rank traces and timelines (fewer files to carry back).
tar czf "$OUT/asyncll-traces.tar.gz" -C "$OUT" trace && rm -rf "$OUT/trace"
