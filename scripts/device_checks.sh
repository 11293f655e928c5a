#!/bin/bash
# The GPU checks run on a lent one-GPU machine (docs/cluster.md, "Memory measured at run time"):
# the issue-36 code paths on CUDA (hf engine in bf16, R3, TIS, RS; smoke shapes, random weights) and
# paper_small's real step cut to 2 of its 12 layers, measured per phase beside the plan. Run from the
# repository root; results under $OUT (default /tmp/rspo-device-checks). Needs torch with CUDA and
# transformers; vLLM is used where installed, else the stand-in engine (the output says which).
set -u
export PYTHONPATH=$PWD
O=${OUT:-/tmp/rspo-device-checks}; mkdir -p "$O"
{ nvidia-smi; python -V; python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"; } > "$O/env.txt" 2>&1
# a MemPool and a graph captured into it, with expandable segments on and off (rspo.rollout.colocate)
timeout 120 python scripts/mempool_check.py | tee "$O/mempool.jsonl"
s=$(date +%s)
timeout 150 python -m rspo preflight --preset configs/smoke.yaml --set model.device=cuda --set algorithm.routing=rollout_replay \
  --set algorithm.rollout_correction=token_truncate --set algorithm.router_shift=true --set rollout.dtype=bfloat16 \
  --out "$O/smoke_cuda" > "$O/smoke_cuda.log" 2>&1
echo "smoke_cuda rc=$? $(( $(date +%s)-s )) s" | tee -a "$O/summary.txt"
tail -12 "$O/smoke_cuda.log"
s=$(date +%s)
timeout 300 python -m rspo preflight --preset configs/paper_small.yaml --layers 2 --out "$O/paper_small" > "$O/paper_small.log" 2>&1
echo "paper_small rc=$? $(( $(date +%s)-s )) s" | tee -a "$O/summary.txt"
tail -14 "$O/paper_small.log"
rm -rf "$O"/*/run/checkpoints "$O"/*/model "$O"/*/records.jsonl
