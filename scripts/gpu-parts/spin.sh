# How long the proxies poll an idle command ring (--proxy-spin-us) against the inter-node leg,
# 2 nodes x 4 ranks on one GPU, decode shape over xgmi. A fragment, sourced by
# scripts/gpu-machine.sh (B, OUT, step, rc); appends to $OUT/spin.txt and prints, per run, rank
# 0's row, the proxies' lines and the traced legs (the device tool returns few files).
#
# The default (200 µs) lets a proxy sleep (up to 50 µs per nap) between dispatch and combine;
# 100000 µs keeps every proxy polling through the run. Each kernel type at both, V1 twice, then
# V1 traced at both (the legs from command pushed to segment seen).
sp_log="$OUT/spin.txt"
sp() { logged "$sp_log" 300 14 "^$|^rank |^┌|^└|^╞|^│ rank|^│ [1-7] |^mori_ep::gpu_internode|^trace: [0-9]+ files" "$@"; }
dec="--num-tokens 128 --hidden 7168 --num-experts 256 --top-k 8 --dtype bf16"
for round in 1 2; do
  step "spin: round $round: V1 decode over xgmi, proxies polling 200 µs, then 100000 µs"
  for us in 200 100000; do
    sp "v1 decode xgmi, proxy-spin-us $us ($round)" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --proxy-spin-us "$us"
  done
done
step "spin: V1-LL and AsyncLL decode over xgmi, 200 and 100000 µs"
for kt in v1_ll async_ll; do
  for us in 200 100000; do
    sp "$kt decode xgmi, proxy-spin-us $us" "$B/bench_dispatch_combine" --kernel-type "$kt" --num-nodes 2 $dec --proxy-spin-us "$us"
  done
done
step "spin: V1 decode over xgmi, traced, 200 and 100000 µs"
sp_tr=$(mktemp -d)
for us in 200 100000; do
  sp "v1 decode xgmi traced, proxy-spin-us $us" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --proxy-spin-us "$us" --trace "$sp_tr/v1-$us.json"
done
rm -rf "$sp_tr"
