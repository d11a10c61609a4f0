# Launches shared across proxies, 2 nodes x 4 ranks on one GPU over xgmi: this build (one
# MORI-IO engine per node, whose copy pool sends the batches its ranks' proxies queue while
# one of them launches out in that thread's next launch of the ordered-copy kernel, up to 64
# segments) against the earlier build ($B/bench_dispatch_combine_prev and
# $B/bench_engine_prev, carried beside the bundle: an engine per rank, a launch per posting
# call, 8 segments at most). A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc);
# appends to $OUT/launches.txt. About 6 minutes on one H100/H200.
#
# - the GPU tests: mori-gpu's (the copy pool's ordered and grouped batches, and batches of
#   three threads queued behind a held launcher going out in one launch), the xgmi backend's
#   and the inter-node EP's;
# - AsyncLL decode, earlier build and this one, three rounds in rotating order, then traced
#   (rank 0's Perfetto file kept as $OUT/launches-asyncll.rank0.json);
# - V1 and V1-LL decode both ways; AsyncLL at 2 x 1, 2 x 2 and the DeepSeek-V3 shape;
# - bench_engine's batch-1 xgmi write both ways (the ordered-copy kernel's larger parameter
#   block does not touch this path: plain writes are copies; the check is that nothing else
#   moved);
# - the targets' baselines (bench_proxy round trip at 1.2 MB, the intranode kernels at 8
#   ranks).
la_log="$OUT/launches.txt"
lal() { logged "$la_log" 300 14 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "launches: GPU tests (mori-gpu, xgmi, inter-node EP)"
logged "$la_log" 300 30 "^$" "mori-gpu GPU tests" "$B/gpu" --ignored --nocapture --test-threads=1
logged "$la_log" 300 14 "^$" "xgmi GPU tests" "$B/xgmi_gpu" --ignored --test-threads=1
logged "$la_log" 300 18 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
prev="$B/bench_dispatch_combine_prev"
[ -x "$prev" ] || { echo "FAILED: $prev is missing (carry the earlier build's binary)" | tee -a "$la_log"; rc=1; prev=""; }
la2() { # NAME ORDER ARGS...: p the earlier build, n this one, in ORDER
  local name=$1 order=$2 x
  shift 2
  for x in $(echo "$order" | grep -o .); do
    case $x in
      p) [ -n "$prev" ] && lal "$name, earlier build" "$prev" "$@" ;;
      n) lal "$name, this build" "$B/bench_dispatch_combine" "$@" ;;
    esac
  done
}
for round in 1 2 3; do
  step "launches: round $round: AsyncLL decode over xgmi"
  order=$(echo "pn np pn" | cut -d' ' -f"$round")
  la2 "async_ll decode xgmi ($round)" "$order" --kernel-type async_ll --num-nodes 2 $dec
done
step "launches: V1 and V1-LL decode over xgmi"
la2 "v1 decode xgmi" np --kernel-type v1 --num-nodes 2 $dec
la2 "v1_ll decode xgmi" pn --kernel-type v1_ll --num-nodes 2 $dec
step "launches: AsyncLL decode over xgmi, traced"
la_tr=$(mktemp -d)
lal "async_ll decode xgmi traced, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$la_tr/al.json"
cp "$la_tr/al.rank0.json" "$OUT/launches-asyncll.rank0.json" 2>/dev/null || true
rm -rf "$la_tr"
step "launches: AsyncLL at 2 x 1, 2 x 2 and the DeepSeek-V3 shape"
lal "async_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec
lal "async_ll decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec
la2 "async_ll V3 xgmi" pn --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "launches: bench_engine batch-1 xgmi write, earlier build and this one"
for eb in "$B/bench_engine_prev" "$B/bench_engine"; do
  [ -x "$eb" ] || { echo "FAILED: $eb is missing" | tee -a "$la_log"; rc=1; continue; }
  logged "$la_log" 120 12 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write ($(basename "$eb"))" "$eb" --local --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --all --sweep-start 8 --sweep-max 4194304 --iters 200 --warmup-iters 20 --log-level warning
done
step "launches: the targets' baselines"
logged "$la_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$la_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
