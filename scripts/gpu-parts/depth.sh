# This build (the dispatch staging kernel's last block hands the staged records over, each
# node's kernels launched in turn, the combine sum held to 64 registers a thread) against the
# earlier build ($B/bench_dispatch_combine_prev: mori_ie_dispatch's block 0 hands over, 90
# registers in the sum) and the intermediate one ($B/bench_dispatch_combine_mid: as this build,
# but each kernel launched on both nodes' streams before the next), all through the
# device-resident calls, 2 nodes x 4 ranks on one GPU, AsyncLL, V1-LL and V1 decode over xgmi,
# with the targets' baselines in the same run. The earlier and intermediate builds are carried
# beside the bundle. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends
# to $OUT/depth.txt. About 70 seconds on one H100/H200 with DEPTH_TESTS=1 (the default: the
# inter-node EP GPU tests first), 25 without. DEPTH_ORDER picks the builds' order (default
# "mnp"; docs/gpu-run/depth-1.txt ran "pnm" without the tests and the last AsyncLL round,
# depth-2.txt the default).
de_log="$OUT/depth.txt"
del() { ep_logged "$de_log" 12 "^copy pools|^calls: " "$@"; }
dec=$EP_DEC
[ "${DEPTH_TESTS:-1}" = 1 ] && ep_tests "$de_log" depth
ep_prev "$de_log"
step "depth: AsyncLL, V1-LL, V1 and AsyncLL again, decode over xgmi, the three builds"
for kt in async_ll v1_ll v1 async_ll; do
  ep_ab del "$prev" "$kt decode xgmi" "${DEPTH_ORDER:-mnp}" --kernel-type "$kt" --num-nodes 2 $dec
done
step "depth: the targets' baselines"
logged "$de_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$de_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
