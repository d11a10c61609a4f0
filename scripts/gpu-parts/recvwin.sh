# The data left where it lands, 2 nodes x 4 ranks on one GPU over xgmi: the received records
# read from the window (the default) against a copy-out kernel (--recv-copy-out), and
# AsyncLL's same-node combine rows read in place by the source's sum, against the earlier
# build ($B/bench_dispatch_combine_prev, carried beside the bundle: it copies out and stores
# same-node rows). A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends
# to $OUT/recvwin.txt and prints, per run, rank 0's row, the spread, the proxies' and copy
# pools' lines and the kernels' split. About 5 minutes on one H100/H200.
#
# - the inter-node EP GPU tests (all three schemes, xgmi and tcp legs, bit-exact; the copy-out
#   for AsyncLL and V1-LL over xgmi);
# - AsyncLL decode three ways (earlier build, --recv-copy-out, default), three rounds in
#   rotating order, then traced (rank 0's Perfetto file kept as
#   $OUT/recvwin-asyncll.rank0.json);
# - AsyncLL with the proxies polling 20 ms (--proxy-spin-us 20000), twice;
# - V1 and V1-LL decode three ways, AsyncLL at the DeepSeek-V3 shape and at 2 x 1 and 2 x 2;
# - the targets' baselines (bench_proxy round trip at 1.2 MB, the intranode kernels at 8
#   ranks).
rw_log="$OUT/recvwin.txt"
rwl() { ep_logged "$rw_log" 22 "" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
ep_tests "$rw_log" recvwin
prev="$B/bench_dispatch_combine_prev"
[ -x "$prev" ] || { echo "FAILED: $prev is missing (carry the earlier build's binary)" | tee -a "$rw_log"; rc=1; prev=""; }
rw3() { # NAME ORDER ARGS...: the three ways in ORDER (p: earlier build, c: copy-out, w: window)
  local name=$1 order=$2 x
  shift 2
  for x in $(echo "$order" | grep -o .); do
    case $x in
      p) [ -n "$prev" ] && rwl "$name, earlier build" "$prev" "$@" ;;
      c) rwl "$name, copy-out" "$B/bench_dispatch_combine" "$@" --recv-copy-out ;;
      w) rwl "$name, in the window" "$B/bench_dispatch_combine" "$@" ;;
    esac
  done
}
for round in 1 2 3; do
  step "recvwin: round $round: AsyncLL decode over xgmi"
  order=$(echo "pcw wpc cwp" | cut -d' ' -f"$round")
  rw3 "async_ll decode xgmi ($round)" "$order" --kernel-type async_ll --num-nodes 2 $dec
done
# Proxies polling 20 ms (the earlier default, which the earlier build keeps) against 200 ms
# (this build's default): whether they nap in the gap between a dispatch and its combine (the
# host reads back and writes the rows). The earlier-build comparison above mixes in this
# difference; these runs separate it.
spin="--proxy-spin-us 20000"
rwl "async_ll decode xgmi, in the window, proxies polling 20 ms (1)" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec $spin
step "recvwin: V1 and V1-LL decode over xgmi"
rw3 "v1 decode xgmi" pcw --kernel-type v1 --num-nodes 2 $dec
rw3 "v1_ll decode xgmi" wcp --kernel-type v1_ll --num-nodes 2 $dec
rwl "async_ll decode xgmi, in the window, proxies polling 20 ms (2)" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec $spin
step "recvwin: AsyncLL decode over xgmi, traced"
rw_tr=$(mktemp -d)
rwl "async_ll decode xgmi traced, in the window" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --trace "$rw_tr/al.json"
cp "$rw_tr/al.rank0.json" "$OUT/recvwin-asyncll.rank0.json" 2>/dev/null || true
rm -rf "$rw_tr"
step "recvwin: AsyncLL at the DeepSeek-V3 shape, earlier build then this one; at 2 x 1 and 2 x 2"
rw3 "async_ll V3 xgmi" pw --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2
rwl "async_ll decode xgmi W=2" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 2 $dec
rwl "async_ll decode xgmi W=4" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --world-size 4 $dec
step "recvwin: the targets' baselines"
logged "$rw_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$rw_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
