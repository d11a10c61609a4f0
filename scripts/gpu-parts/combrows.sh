# AsyncLL's combine input put into the window as rows the proxy moves as they are (the
# default over xgmi) against staging the rows for other nodes in a kernel first
# (--combine-staging), 2 nodes x 4 ranks on one GPU over xgmi. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/combrows.txt and prints, per run,
# rank 0's row, the proxies' and copy pools' lines and the kernels' split.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, AsyncLL both ways,
#   bit-exact);
# - AsyncLL decode, staged and in the window, four rounds in alternating order, then traced
#   once each;
# - AsyncLL at the DeepSeek-V3 shape (T=4096, fp8 dispatch, bf16 combine), both ways;
# - V1 and V1-LL decode, AsyncLL at 2 x 1 and 2 x 2, and the targets' baselines (bench_proxy
#   round trip at 1.2 MB, the intranode kernels at 8 ranks).
cr_log="$OUT/combrows.txt"
crl() { logged "$cr_log" 300 22 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files|^times:|^host CPU" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
ep_tests "$cr_log" combrows
cr_ab() { # NAME ARGS...: staged, then in the window
  local name=$1
  shift
  crl "$name, staged" "$@" --combine-staging
  crl "$name, in the window" "$@"
}
cr_ba() { # NAME ARGS...: in the window, then staged (the other order)
  local name=$1
  shift
  crl "$name, in the window" "$@"
  crl "$name, staged" "$@" --combine-staging
}
for round in 1 2 3 4; do
  step "combrows: round $round: AsyncLL decode over xgmi"
  if [ $((round % 2)) = 1 ]; then ab=cr_ab; else ab=cr_ba; fi
  $ab "async_ll decode xgmi ($round)" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
done
step "combrows: AsyncLL decode over xgmi, traced"
cr_tr=$(mktemp -d)
cr_ab "async_ll decode xgmi traced" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$cr_tr/al.json"
rm -rf "$cr_tr"
step "combrows: AsyncLL at the DeepSeek-V3 shape over xgmi"
cr_ab "async_ll V3 xgmi" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
step "combrows: V1 and V1-LL decode over xgmi, AsyncLL at 2 x 1 and 2 x 2, and the targets' baselines"
crl "v1 decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec
crl "v1_ll decode xgmi" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec
crl "async_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec
crl "async_ll decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec
logged "$cr_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$cr_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
