"""Torch alone, on a GPU: does torch's caching allocator refuse vLLM's kind of memory pool under
expandable segments, and does rspo's toggle (rspo.rollout.colocate.engine_allocator) get the engine
past it?

vLLM 0.32's sleep mode captures its CUDA graphs into ``torch.cuda.MemPool(allocator)``, a pool with
its own pluggable allocator (CuMemAllocator). torch refuses expandable segments only for such a pool
(CUDACachingAllocator: ``active_pool = owner_PrivatePool && owner_PrivatePool->allocator()``); a
plain ``torch.cuda.MemPool()`` follows the current setting and passes either way. So the pool here
is built on a pluggable allocator of its own, a few lines of C (cudaMalloc / cudaFree, looked up in
the libcudart torch has loaded) compiled with the system's C compiler, as vLLM's is. Four cases, each
in a fresh process (the setting is read when CUDA starts), one JSON line each:

- ``off``: expandable segments off; the allocator's pool: expected ok;
- ``on``: expandable segments on; the allocator's pool: expected refused (what vLLM would hit);
- ``on+toggle``: on, the pool used inside rspo's ``engine_allocator()``: expected ok;
- ``plain``: on, a plain ``MemPool()``: ok, which is why the earlier check (a plain pool) proved
  nothing.

In each: a tensor allocated in the pool, then a CUDA graph captured into it and replayed. Each case
also says whether expandable segments are in effect at all (a plain allocation's segment in torch's
memory snapshot): torch uses them only where the driver offers virtual memory management, and
without them nothing is refused. The last line says whether every case came out as expected (exit
0), did not (exit 1), or could not be told (exit 2: the ``on`` case passed with expandable segments
not in effect).

    python scripts/mempool_check.py        # needs a GPU and a C compiler (scripts/device_checks.sh)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ALLOCATOR_C = r"""
#include <dlfcn.h>
#include <stddef.h>
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
static malloc_fn cuda_malloc;
static free_fn cuda_free;
static void resolve(void) {
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", 0};
    void *h = RTLD_DEFAULT;
    cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
    for (int i = 0; !cuda_malloc && names[i]; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) h = dlopen(names[i], RTLD_NOW);
        if (h) cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
    }
    cuda_free = (free_fn)dlsym(h, "cudaFree");
}
void *rspo_malloc(ptrdiff_t size, int device, void *stream) {
    void *p = 0;
    if (!cuda_malloc) resolve();
    if (!cuda_malloc || cuda_malloc(&p, (size_t)size) != 0) return 0;
    return p;
}
void rspo_free(void *ptr, ptrdiff_t size, int device, void *stream) {
    if (!cuda_free) resolve();
    if (cuda_free) cuda_free(ptr);
}
"""

CASE = """
import json, sys, contextlib, torch
case, lib = sys.argv[1], sys.argv[2]
out = {"case": case, "torch": torch.__version__}
get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
try:
    z = torch.empty(1 << 22, device="cuda")  # a plain allocation: are expandable segments in effect here?
    segments = torch.cuda.memory_snapshot()
    out["expandable_in_effect"] = any(seg.get("is_expandable", False) for seg in segments)
    del z
    if case == "plain":
        pool = torch.cuda.MemPool()
    else:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "rspo_malloc", "rspo_free")
        pool = torch.cuda.MemPool(alloc.allocator())
    ctx = contextlib.nullcontext()
    if case == "on+toggle":
        from rspo.rollout.colocate import engine_allocator
        ctx = engine_allocator()
    with ctx:
        out["settings"] = get() if get else None
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
    out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
if get is not None:
    out["settings_after"] = get()
print(json.dumps(out))
"""

CASES = {  # case -> (PYTORCH_CUDA_ALLOC_CONF, expected ok)
    "off": ("expandable_segments:False,max_split_size_mb:512", True),
    "on": ("expandable_segments:True,max_split_size_mb:512", False),
    "on+toggle": ("expandable_segments:True,max_split_size_mb:512", True),
    "plain": ("expandable_segments:True,max_split_size_mb:512", True),
}


def build_allocator(folder: Path) -> Path:
    """The pluggable allocator's shared library (cc, else gcc)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) to build the pluggable allocator")
    src, lib = folder / "alloc.c", folder / "alloc.so"
    src.write_text(ALLOCATOR_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(lib), "-ldl"], check=True)
    return lib


def main() -> int:
    repo = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="rspo-mempool-") as tmp:
        lib = build_allocator(Path(tmp))
        as_expected, inconclusive = True, False
        for case, (setting, expected) in CASES.items():
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=setting, PYTHONPATH=repo)
            r = subprocess.run(
                [sys.executable, "-c", CASE, case, str(lib)], env=env, capture_output=True, text=True, timeout=120
            )
            lines = r.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if lines else {"case": case, "ok": False, "error": r.stderr[-300:]}
            # a refusal counts only as torch's own: the message names expandable segments
            refused_so = not row.get("ok") and "expandable" in row.get("error", "").lower()
            row.update(alloc_conf=setting, expected_ok=expected, as_expected=row.get("ok") if expected else refused_so)
            if not expected and row.get("ok") and row.get("expandable_in_effect") is False:
                # the machine runs without them (no virtual memory management: torch falls back to
                # cudaMalloc), so nothing can be refused: the refusal is not tested here
                row["as_expected"] = None
                inconclusive = True
            as_expected &= row["as_expected"] is not False
            print(json.dumps(row), flush=True)
    verdict = "as expected" if as_expected else "NOT as expected"
    if as_expected and inconclusive:
        verdict = "inconclusive: expandable segments are not in effect on this machine, so the refusal was not tested"
    print(json.dumps({"mempool_check": verdict}))
    return 0 if as_expected and not inconclusive else 1 if not as_expected else 2


if __name__ == "__main__":
    raise SystemExit(main())
