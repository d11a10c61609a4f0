# MORI-EP on the GPU machine (issue 8; with two or more GPUs also issue 6). A fragment,
# sourced by scripts/gpu-machine.sh, which provides B (the bundle directory), OUT, the
# function `step` and the status variable `rc`. Appends everything to $OUT/ep.txt and prints
# the per-GPU tables. About 2-3 minutes on one H200.
#
# - bench_dispatch_combine, 8 ranks sharing GPU 0 in one process (one launch serves them
#   all): DeepSeek-V3 shape (T=4096, H=7168, E=256, K=8) with fp8 dispatch (128-wide f32
#   scales) and bf16 combine, the same with bf16 dispatch, and the decode shape (T=128) with
#   a cold L2; every run checks its first iteration against the host reference and prints
#   a plain cuMemcpyDtoD of the same byte count measured in the same run (the roofline).
# - scripts/ep_torch_baseline.py: a PyTorch implementation of the same dispatch/combine
#   (index_select / index_add_) for the same shapes on the same GPU.
# - With two or more GPUs: one rank per GPU (two processes, heaps joined by IPC over NVLink),
#   8 ranks over 2 GPUs in one process, and the PyTorch NCCL all-to-all version under
#   torchrun (NCCL_NVLS_ENABLE=0).

ep_log="$OUT/ep.txt"
# ep NAME CMD...: see logged (scripts/gpu-parts/lib.sh); per-rank rows are left to the log.
ep() { logged "$ep_log" 150 16 "^rank [0-9]+ recv|^│ [0-9]+ +[0-9]+ +[0-9]+ " "$@"; }
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
bdc="$B/bench_dispatch_combine"

if [ -z "${ONLY_MULTI:-}" ]; then
step "EP: GPU tests (routing corners against the oracle, out-of-range ids reported or dropped, short combine input refused)"
ep "ep_gpu tests" "$B/ep_gpu" --ignored --nocapture --test-threads=1

step "EP: correctness corners (odd T, i32 ids, weighted combine, f32, 3 tokens), 8 ranks on GPU 0"
ep "fp8 i32 weighted T=100" "$bdc" --num-tokens 100 --hidden 512 --num-experts 64 --top-k 8 --dtype fp8 --idx-type i32 --weighted --iters 3 --warmup 1
ep "f32 T=3" "$bdc" --num-tokens 3 --hidden 256 --num-experts 32 --top-k 4 --dtype f32 --combine-dtype f32 --iters 3 --warmup 1
ep "bf16 H=4096 T=257" "$bdc" --num-tokens 257 --hidden 4096 --num-experts 64 --top-k 6 --dtype bf16 --iters 3 --warmup 1

step "EP: 8 ranks on GPU 0, DeepSeek-V3 and decode shapes"
ep "DeepSeek-V3 fp8" "$bdc" --dtype fp8 --iters 20 --warmup 3 --json "$OUT/ep-dsv3-fp8.json" --trace "$OUT/ep-trace-dsv3-fp8.json"
ep "DeepSeek-V3 bf16" "$bdc" --dtype bf16 --iters 20 --warmup 3 --json "$OUT/ep-dsv3-bf16.json"
ep "decode fp8" "$bdc" --num-tokens 128 --dtype fp8 --iters 50 --warmup 5 --l2-flush --json "$OUT/ep-decode-fp8.json"
ep "decode bf16" "$bdc" --num-tokens 128 --dtype bf16 --iters 50 --warmup 5 --l2-flush --json "$OUT/ep-decode-bf16.json"

step "EP: PyTorch index_select / index_add_ version, 8 logical ranks on GPU 0, same shapes"
ep "torch single GPU" python3 scripts/ep_torch_baseline.py --mode single --shapes --json "$OUT/ep-torch-single.json"

fi

if [ "$ngpu" -ge 2 ]; then
  step "EP: $ngpu GPUs: one rank per GPU (2 processes, IPC over NVLink)"
  ep "EP2 DeepSeek-V3 fp8" "$bdc" --world-size 2 --num-gpus 2 --procs 2 --dtype fp8 --iters 20 --warmup 3 --json "$OUT/ep2-dsv3-fp8.json"
  ep "EP2 DeepSeek-V3 bf16" "$bdc" --world-size 2 --num-gpus 2 --procs 2 --dtype bf16 --iters 20 --warmup 3 --json "$OUT/ep2-dsv3-bf16.json"
  ep "EP2 decode bf16" "$bdc" --world-size 2 --num-gpus 2 --procs 2 --num-tokens 128 --dtype bf16 --iters 50 --warmup 5 --json "$OUT/ep2-decode-bf16.json"
  step "EP: 8 ranks over 2 GPUs (4 per GPU), one process and two processes"
  ep "EP8 on 2 GPUs, 1 process, fp8" "$bdc" --world-size 8 --num-gpus 2 --dtype fp8 --iters 20 --warmup 3 --json "$OUT/ep8x2-1p-fp8.json"
  ep "EP8 on 2 GPUs, 2 processes, fp8" "$bdc" --world-size 8 --num-gpus 2 --procs 2 --dtype fp8 --iters 20 --warmup 3 --json "$OUT/ep8x2-2p-fp8.json"
  step "EP: PyTorch NCCL all_to_all_single version, one rank per GPU"
  ep "torch NCCL 2 GPUs" torchrun --standalone --nproc_per_node=2 scripts/ep_torch_baseline.py --mode nccl --shapes --json "$OUT/ep-torch-nccl.json"
else
  step "EP: $ngpu GPU(s): one rank per GPU and the NCCL comparison need two GPUs; not run"
fi
