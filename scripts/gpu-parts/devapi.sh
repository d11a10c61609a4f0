# The device-resident calls of InterNodeGpu (dispatch_device / combine_device: inputs in GPU
# buffers, records and combine rows left where the kernels use them) against the host-bytes
# calls, 2 nodes x 4 ranks on one GPU over xgmi: the same kernels, so the GPU times should
# match; the host time per call is what changes. A fragment, sourced by scripts/gpu-machine.sh
# (B, OUT, step, rc); appends to $OUT/devapi.txt. About 4 minutes on one H100/H200.
#
# - the inter-node EP GPU tests (device_calls_equal_the_reference among them: AsyncLL and V1,
#   bit-exact against the host reference, inputs short of their shape and a combine short of
#   the received rows refused);
# - AsyncLL decode, host calls then device calls, twice in alternating order; V1 and V1-LL
#   decode and AsyncLL at the DeepSeek-V3 shape with the device calls; AsyncLL decode over tcp
#   with the device calls;
# - the targets' baselines (bench_proxy round trip at 1.2 MB, the intranode kernels at 8
#   ranks).
da_log="$OUT/devapi.txt"
dal() { ep_logged "$da_log" 14 "^copy pools" "$@"; }
dec=$EP_DEC
ep_tests "$da_log" devapi
step "devapi: AsyncLL decode over xgmi, host calls and device calls"
dal "async_ll decode xgmi (1), host calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
dal "async_ll decode xgmi (1), device calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --device-api
dal "async_ll decode xgmi (2), device calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --device-api
dal "async_ll decode xgmi (2), host calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec
step "devapi: V1, V1-LL, the DeepSeek-V3 shape and tcp with the device calls"
dal "v1 decode xgmi, device calls" "$B/bench_dispatch_combine" --kernel-type v1 --num-nodes 2 $dec --device-api
dal "v1_ll decode xgmi, device calls" "$B/bench_dispatch_combine" --kernel-type v1_ll --num-nodes 2 $dec --device-api
dal "async_ll V3 xgmi, device calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 --num-tokens 4096 --hidden 7168 --num-experts 256 --top-k 8 --dtype fp8 --iters 5 --warmup 2 --device-api
dal "async_ll decode tcp, device calls" "$B/bench_dispatch_combine" --kernel-type async_ll --num-nodes 2 $dec --transport tcp --iters 5 --warmup 2 --device-api
step "devapi: the targets' baselines"
logged "$da_log" 120 8 "^$" "bench_proxy xgmi" "$B/bench_proxy" --transport xgmi --sizes 8,1213632 --iters 100 --flood-bytes 0
logged "$da_log" 120 8 "^$" "intranode decode, 8 ranks on one GPU" "$B/bench_dispatch_combine" $dec
