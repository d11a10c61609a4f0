# Ordered batches through one launch of the ordered-copy kernel (the copy pool's default on
# CUDA) against one async copy per segment and a flag write (MORI_GPU_POOL_ORDERED_KERNEL=0),
# 2 nodes x 4 ranks on one GPU, decode shape over xgmi. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/ordered.txt and prints, per run,
# rank 0's row, the proxies' and copy pools' lines (the device tool returns few files).
#
# - the copy pool's GPU tests (the ordered-copy kernel's among them), the xgmi backend's, and
#   the inter-node EP's (all three schemes, xgmi and tcp legs, bit-exact);
# - V1 decode, copies then the kernel, three rounds; V1-LL and AsyncLL once each; V1 traced
#   both ways (the legs from command pushed to segment seen).
or_log="$OUT/ordered.txt"
orl() { logged "$or_log" 300 14 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "ordered: GPU tests: copy pool, xgmi backend, inter-node EP"
logged "$or_log" 300 6 "^$" "copy pool GPU tests" "$B/gpu" --ignored --test-threads=1 copy_pool
logged "$or_log" 300 14 "^$" "xgmi GPU tests" "$B/xgmi_gpu" --ignored --test-threads=1
logged "$or_log" 300 14 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
ord_ab() { # NAME ARGS...: the run with copies, then with the kernel
  local name=$1
  shift
  MORI_GPU_POOL_ORDERED_KERNEL=0 orl "$name, copies" "$@"
  MORI_GPU_POOL_ORDERED_KERNEL=1 orl "$name, kernel" "$@"
}
for round in 1 2 3; do
  step "ordered: round $round: V1 decode over xgmi, copies then the kernel"
  ord_ab "v1 decode xgmi ($round)" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
done
step "ordered: V1-LL and AsyncLL decode over xgmi"
ord_ab "v1_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec
ord_ab "async_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
step "ordered: V1 decode over xgmi, traced"
or_tr=$(mktemp -d)
ord_ab "v1 decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --trace "$or_tr/v1.json"
rm -rf "$or_tr"
