# The layout in the dispatch staging kernel (each staging block lays out its share of the
# tokens; no layout kernel), against the earlier build ($B/bench_dispatch_combine_prev, carried
# beside the bundle: a layout kernel of one block per rank first), both through the
# device-resident calls (--device-api), 2 nodes x 4 ranks on one GPU; then the inter-node EP
# table's figures with this build and their baselines, in the same run. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/fused.txt. About 6 minutes on
# one H100/H200.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, bit-exact, the device
#   calls);
# - AsyncLL decode over xgmi, earlier build and this one, three rounds in rotating order; V1,
#   V1-LL and the DeepSeek-V3 shape both ways;
# - this build: AsyncLL decode traced (rank 0's Perfetto file kept as
#   $OUT/fused-asyncll.rank0.json), through the host calls, at 2 x 1 and 2 x 2, over tcp;
# - the targets' baselines (bench_proxy round trips over xgmi and tcp, bench_engine batch-1
#   xgmi writes at the legs' sizes, the intranode kernels at 8 ranks).
fu_log="$OUT/fused.txt"
ful() { ep_logged "$fu_log" 12 "^copy pools|^calls: " "$@"; }
dec=$EP_DEC
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2"
ep_tests "$fu_log" fused
ep_prev "$fu_log"
fu2() { ep_ab ful "$prev" "$@"; }
ep_rounds ful fused "pn np pn" "async_ll decode xgmi" --kernel-type async_ll --num-nodes 2 $dec
step "fused: V1, V1-LL and the DeepSeek-V3 shape"
fu2 "v1 decode xgmi" np --kernel-type v1 --num-nodes 2 $dec
fu2 "v1_ll decode xgmi" pn --kernel-type v1_ll --num-nodes 2 $dec
fu2 "async_ll V3 xgmi" np --kernel-type async_ll --num-nodes 2 $v3
step "fused: this build traced, through the host calls, at 2 x 1 and 2 x 2, over tcp"
fu_tr=$(mktemp -d)
ful "async_ll decode xgmi traced, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --device-api --trace "$fu_tr/al.json"
cp "$fu_tr/al.rank0.json" "$OUT/fused-asyncll.rank0.json" 2>/dev/null || true
rm -rf "$fu_tr"
ful "async_ll decode xgmi, host calls, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
ful "async_ll decode xgmi W=2, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec --device-api
ful "async_ll decode xgmi W=4, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec --device-api
ful "async_ll decode tcp, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2 --device-api
step "fused: the targets' baselines"
ep_targets "$fu_log" $dec
