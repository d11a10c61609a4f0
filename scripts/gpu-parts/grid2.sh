# AsyncLL decode at 2 x 4 over xgmi through the device calls, the grids swept: the blocks per
# rank of the kernels that wait for nothing (--copy-blocks 32, 64: the default, 128; the
# layout and staging, the sum) in rotating order, twice, then the co-resident grid's blocks per
# rank (--block-num 8 and 24 against the default 16; 24 is refused at 8 ranks: 192 blocks
# cannot all be resident on 132 multiprocessors); with the targets' baselines in the same
# run. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends to
# $OUT/grid2.txt. About 3 minutes on one H100/H200.
g2_log="$OUT/grid2.txt"
g2l() { ep_logged "$g2_log" 6 "^copy pools|^calls: |^proxies|^host time" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16 --kernel-type async_ll --num-nodes 2 --device-api"
for round in 1 2; do
  step "grid2: round $round: --copy-blocks"
  for cb in $(echo "32 64 128|128 32 64" | cut -d'|' -f"$round"); do
    g2l "async_ll decode xgmi, --copy-blocks $cb ($round)" "$B/bench_dispatch_combine" $dec --copy-blocks "$cb"
  done
done
step "grid2: --block-num"
for bn in 8 24; do
  g2l "async_ll decode xgmi, --block-num $bn" "$B/bench_dispatch_combine" $dec --block-num "$bn"
done
step "grid2: the targets' baselines"
logged "$g2_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$g2_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" --num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16
