# Armed ordered-copy launches (mori_gpu::CopyPoolConfig::armed_depth, MORI_GPU_POOL_ARMED:
# posting an ordered batch writes its table and a doorbell into mapped host memory and makes
# no driver call): the copy pool's GPU tests, the armed ones among them (every byte of 24
# batches, the launch and fire counts, the order a host observer sees, a buffer freed once the
# pool is disarmed, the pool dropped), then the inter-node EP with its engines' pools armed
# (MORI_GPU_POOL_ARMED=2): its GPU tests (the object's drop disarms the engines before it
# frees), the leg alone against bench_engine and the 2 x 4 decode rows, each armed and not in
# alternating order. A fragment, sourced by scripts/gpu-machine.sh (B, OUT, step, rc); appends
# to $OUT/armed.txt. ARMED_EP=0 stops after the copy pool's tests; ARMED_EP_TESTS=0 skips the
# EP's GPU tests, ARMED_TS the leg-alone token counts (default "32 128 512"), ARMED_DECODE the
# decode runs (kernel type:order of armed depths, default "async_ll:0220 v1_ll:20 v1:02").
ar_log="$OUT/armed.txt"
step "armed: the copy pool's GPU tests"
logged "$ar_log" 300 12 "^$" "the copy pool's GPU tests" "$B/gpu" --ignored --test-threads=1 --nocapture copy_pool
if [ "${ARMED_EP:-1}" = 1 ]; then
  if [ "${ARMED_EP_TESTS:-1}" = 1 ]; then
    step "armed: the inter-node EP GPU tests with armed launches"
    logged "$ar_log" 240 20 "^$" "ep internode GPU tests, MORI_GPU_POOL_ARMED=2" env MORI_GPU_POOL_ARMED=2 "$B/ep_internode_gpu" --ignored --test-threads=1
  fi
  arl() { ep_logged "$ar_log" 14 "^copy pools|^calls: |^spread|^host time" "$@"; }
  # ar_ab NAME ORDER ARGS...: this build's bench_dispatch_combine ARGS --device-api, once per
  # letter of ORDER: 0 not armed, 2 two launches armed per engine.
  ar_ab() {
    local name=$1 order=$2 d
    shift 2
    for d in $(echo "$order" | grep -o .); do
      arl "$name, armed $d" env MORI_GPU_POOL_ARMED="$d" "$B/bench_dispatch_combine" "$@" --device-api
    done
  }
  leg1="--world-size 2 --num-nodes 2 --zero-token-ranks 1 --remote-only-ranks 0 --iters 50 --warmup 5"
  round=0
  for t in ${ARMED_TS:-32 128 512}; do
    round=$((round + 1))
    step "armed: the leg alone, T = $t, against bench_engine at $((t * 14448)) B"
    order=02
    [ $((round % 2)) = 0 ] && order=20
    ar_ab "async_ll 2x1 leg alone T=$t" "$order" --kernel-type async_ll --num-tokens "$t" --hidden 7168 --num-experts 256 \
      --top-k 8 --dtype bf16 $leg1
    logged "$ar_log" 120 6 "^[0-9T:.-]+Z |^note:" "bench_engine xgmi write $((t * 14448)) B" "$B/bench_engine" --local \
      --backend xgmi --mem-type gpu --op write --enable-sess --transfer-batch-size 1 --buffer-size $((t * 14448)) \
      --iters 200 --warmup-iters 20 --log-level warning
  done
  step "armed: 2 x 4 decode over xgmi"
  for kd in ${ARMED_DECODE:-async_ll:0220 v1_ll:20 v1:02}; do
    ar_ab "${kd%%:*} decode xgmi" "${kd##*:}" --kernel-type "${kd%%:*}" --num-nodes 2 $EP_DEC
  done
fi
