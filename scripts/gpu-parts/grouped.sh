# A proxy's burst of ordered batches (one per destination) posted in one MORI-IO call, which
# the xgmi backend packs into shared ordered-copy launches (the default), against one post
# and one launch per destination (MORI_EP_PROXY_GROUPED=0), 2 nodes x 4 ranks on one GPU,
# decode shape over xgmi. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc);
# appends to $OUT/grouped.txt and prints, per run, the slowest rank's row, the proxies' and
# copy pools' lines and the kernels' split (the device tool returns few files).
#
# - the copy pool's GPU tests (grouped launches among them), the xgmi backend's (the
#   multi-post), and the inter-node EP's (all three schemes, xgmi and tcp legs, bit-exact);
# - V1, V1-LL and AsyncLL decode, one post per destination then grouped, two rounds;
# - AsyncLL and V1 traced both ways (the legs from command pushed to segment seen);
# - the targets' baselines in the same call: bench_proxy's round trip at the leg's size, the
#   intranode kernels at 8 ranks.
gr_log="$OUT/grouped.txt"
grl() { logged "$gr_log" 300 22 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "grouped: GPU tests: copy pool, xgmi backend, inter-node EP"
logged "$gr_log" 300 6 "^$" "copy pool GPU tests" "$B/gpu" --ignored --test-threads=1 copy_pool
logged "$gr_log" 300 16 "^$" "xgmi GPU tests" "$B/xgmi_gpu" --ignored --test-threads=1
logged "$gr_log" 300 14 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
gr_ab() { # NAME ARGS...: one post per destination, then grouped
  local name=$1
  shift
  MORI_EP_PROXY_GROUPED=0 grl "$name, per destination" "$@"
  MORI_EP_PROXY_GROUPED=1 grl "$name, grouped" "$@"
}
for round in 1 2; do
  for kt in v1 v1_ll async_ll; do
    step "grouped: round $round: $kt decode over xgmi"
    gr_ab "$kt decode xgmi ($round)" "$B/bench_dispatch_combine" --kernel-type $kt --num-nodes 2 $dec
  done
done
step "grouped: AsyncLL and V1 decode over xgmi, traced"
gr_tr=$(mktemp -d)
gr_ab "async_ll decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$gr_tr/al.json"
gr_ab "v1 decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --trace "$gr_tr/v1.json"
rm -rf "$gr_tr"
step "grouped: baselines: put-with-signal round trip (xgmi, 1.2 MB), intranode kernels at 8 ranks"
logged "$gr_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$gr_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
