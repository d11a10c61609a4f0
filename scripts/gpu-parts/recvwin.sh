# The received records read from the window where they landed (the default) against a
# copy-out kernel that writes them into output buffers first (--recv-copy-out), 2 nodes x 4
# ranks on one GPU over xgmi. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step,
# rc); appends to $OUT/recvwin.txt and prints, per run, rank 0's row, the proxies' and copy
# pools' lines and the kernels' split. About 4 minutes on one H100/H200.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, both ways, bit-exact);
# - AsyncLL decode both ways, four rounds in alternating order, then traced (rank 0's
#   Perfetto file kept as $OUT/recvwin-asyncll.rank0.json);
# - V1 and V1-LL decode both ways, AsyncLL at the DeepSeek-V3 shape both ways;
# - the targets' baselines (bench_proxy round trip at 1.2 MB, the intranode kernels at 8
#   ranks).
rw_log="$OUT/recvwin.txt"
rwl() { logged "$rw_log" 300 22 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
step "recvwin: inter-node EP GPU tests"
logged "$rw_log" 300 18 "^$" "ep internode GPU tests" "$B/ep_internode_gpu" --ignored --test-threads=1
rw_ab() { # NAME ARGS...: copy-out, then in the window
  local name=$1
  shift
  rwl "$name, copy-out" "$@" --recv-copy-out
  rwl "$name, in the window" "$@"
}
rw_ba() { # NAME ARGS...: in the window, then copy-out
  local name=$1
  shift
  rwl "$name, in the window" "$@"
  rwl "$name, copy-out" "$@" --recv-copy-out
}
for round in 1 2 3 4; do
  step "recvwin: round $round: AsyncLL decode over xgmi"
  if [ $((round % 2)) = 1 ]; then ab=rw_ab; else ab=rw_ba; fi
  $ab "async_ll decode xgmi ($round)" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
done
step "recvwin: AsyncLL decode over xgmi, traced, in the window"
rw_tr=$(mktemp -d)
rwl "async_ll decode xgmi traced, in the window" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$rw_tr/al.json"
cp "$rw_tr/al.rank0.json" "$OUT/recvwin-asyncll.rank0.json" 2>/dev/null || true
rm -rf "$rw_tr"
step "recvwin: V1 and V1-LL decode over xgmi, AsyncLL at the DeepSeek-V3 shape, both ways"
rw_ab "v1 decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
rw_ba "v1_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec
rw_ab "async_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "recvwin: the targets' baselines"
logged "$rw_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$rw_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
