"""Torch alone, on a GPU: does this torch's caching allocator let a MemPool be used, and a CUDA graph
be captured into it, with expandable segments on and off? vLLM 0.32's sleep mode captures its CUDA
graphs into such a pool (a pluggable cuMem allocator); rspo builds and wakes the engine with
expandable segments off for that reason (rspo.rollout.colocate.engine_allocator). Each case runs in
a fresh process (the setting is read when CUDA starts); one JSON line per case.

    python scripts/mempool_check.py        # needs a GPU (scripts/device_checks.sh runs it)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASE = """
import json, torch
out = {"torch": torch.__version__, "setting": %r}
try:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.ones(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g, pool=pool.id):
        y = x * 2
    g.replay()
    torch.cuda.synchronize()
    out.update(ok=True, value=float(y[0]))
except Exception as e:  # what a real engine start would raise
    out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}")
print(json.dumps(out))
"""


def main() -> int:
    for setting in ("expandable_segments:False", "expandable_segments:True"):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=setting)
        r = subprocess.run([sys.executable, "-c", CASE % setting], env=env, capture_output=True, text=True)
        line = (
            r.stdout.strip().splitlines()[-1]
            if r.stdout.strip()
            else json.dumps({"setting": setting, "ok": False, "error": r.stderr[-300:]})
        )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
