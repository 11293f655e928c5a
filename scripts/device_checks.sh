#!/bin/bash
# The GPU checks run on a lent one-GPU machine (docs/cluster.md, "What a lent GPU measured"), most
# important first, each under its own time limit:
#   1. the allocator fix: a MemPool with its own (pluggable) allocator, as vLLM's sleep-mode pool is,
#      under expandable segments off, on, on through rspo's toggle, and a plain pool (mempool_check.py;
#      exit 1 when a case does not come out as expected);
#   2. which experts implementation transformers gives Qwen3-30B-A3B's MoE layer, and each one's speed
#      on one MoE block (moe_block_check.py), with a large bf16 matrix product as the GPU's ceiling;
#   3. paper_small's real step cut to 2 of its 12 layers (rspo preflight): memory per phase beside the
#      plan, and the update's model-FLOPs utilisation;
#   4. the smoke preset on cuda through the hf engine in bf16 with R3, TIS and RS (rspo preflight).
# Run from the repository root; results under $OUT (default /tmp/rspo-device-checks). Needs torch with
# CUDA, transformers and a C compiler; vLLM is used where installed, else the stand-in engine (the
# output says which).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/rspo-device-checks}; mkdir -p "$O"
{ nvidia-smi; python -V; python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"; } > "$O/env.txt" 2>&1
head -12 "$O/env.txt"
step() {  # step NAME LIMIT_S COMMAND...: output to $O/NAME.log, a summary line with rc and seconds
  local name=$1 limit=$2; shift 2
  local s; s=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" | tee -a "$O/summary.txt"
  tail -16 "$O/$name.log"
}
step mempool 100 python scripts/mempool_check.py
step moe_block 90 python scripts/moe_block_check.py --tokens 16384 --repeats 5
step paper_small 230 python -m rspo preflight --preset configs/paper_small.yaml --layers 2 --out "$O/paper_small"
step smoke_cuda 100 python -m rspo preflight --preset configs/smoke.yaml --set model.device=cuda \
  --set algorithm.routing=rollout_replay --set algorithm.rollout_correction=token_truncate \
  --set algorithm.router_shift=true --set rollout.dtype=bfloat16 --out "$O/smoke_cuda"
rm -rf "$O"/paper_small "$O"/smoke_cuda  # their JSON lines are in the logs; at most 8 files come back
