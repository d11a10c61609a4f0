# The inter-node EP table's figures with this build (the dispatch staging kernel's last block
# hands the staged records over, each node's kernels launched in turn, the combine sum held
# to 64 registers a thread), against the earlier build ($B/bench_dispatch_combine_prev:
# mori_ie_dispatch's block 0 hands over, 90 registers in the sum) and the intermediate one
# ($B/bench_dispatch_combine_mid: as this build, but each kernel launched on both nodes'
# streams before the next), all through the device-resident calls, 2 nodes x 4 ranks on one
# GPU, with the targets' baselines in the same run. The earlier and intermediate builds are
# carried beside the bundle. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc);
# appends to $OUT/depth.txt. About 3 minutes on one H100/H200.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, bit-exact, the device
#   calls);
# - AsyncLL and V1-LL decode over xgmi, the three builds, two rounds in rotating order; V1,
#   the earlier build and this one, twice;
# - this build: AsyncLL decode traced (every rank's Perfetto file kept as
#   $OUT/depth-asyncll.rankR.json, one clock), through the host calls, at 2 x 1 and 2 x 2,
#   over tcp, at the DeepSeek-V3 shape;
# - the targets' baselines (ep_targets).
de_log="$OUT/depth.txt"
del() { ep_logged "$de_log" 12 "^copy pools|^calls: " "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
v3="--num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2"
step "depth: inter-node EP GPU tests"
logged "$de_log" 300 20 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
ep_prev "$de_log"
de3() { ep_ab del "$prev" "$@"; }
for round in 1 2; do
  step "depth: round $round: AsyncLL, V1-LL and V1 decode over xgmi"
  order=$(echo "pnm mpn" | cut -d' ' -f"$round")
  de3 "async_ll decode xgmi ($round)" "$order" --kernel-type async_ll --num-nodes 2 $dec
  de3 "v1_ll decode xgmi ($round)" "$order" --kernel-type v1_ll --num-nodes 2 $dec
  de3 "v1 decode xgmi ($round)" "$(echo "$order" | tr -d m)" --kernel-type v1 --num-nodes 2 $dec
done
step "depth: this build traced, through the host calls, at 2 x 1 and 2 x 2, over tcp, V3"
de_tr=$(mktemp -d)
del "async_ll decode xgmi traced, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --device-api --trace "$de_tr/al.json"
for f in "$de_tr"/al.rank*.json; do [ -f "$f" ] && cp "$f" "$OUT/depth-asyncll.${f##*/al.}"; done
rm -rf "$de_tr"
del "async_ll decode xgmi, host calls, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
del "async_ll decode xgmi W=2, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec --device-api
del "async_ll decode xgmi W=4, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec --device-api
del "async_ll decode tcp, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2 --device-api
del "async_ll V3 xgmi, this build" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $v3 --device-api
step "depth: the targets' baselines"
ep_targets "$de_log" $dec
