"""Shared test setup: one torch thread (the 2-core machines slow down ~50x when
OpenMP threads from parallel jobs fight), deterministic seeds."""

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# model shapes the memory plan keeps on disk (rspo.gpu_memory.shape): in the temp folder, not the
# user's ~/.cache, shared by the workers and the Snakemake processes the tests start
os.environ.setdefault("RSPO_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"rspo-test-cache-{os.getuid()}"))

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass

# The longest test files first, in turns for the two workers (`make test` runs pytest-xdist with
# --dist loadfile --no-loadscope-reorder, which hands out files in this order, two to each worker at
# the start). xdist's default order, most tests first, started the smoke DAG (2 tests, ~10 min) last,
# so it ran alone at the end while the other worker waited. Seconds measured on 2 cores, 2026-11-25.
LONGEST_FIRST = (
    "test_workflow_smoke.py",  # ~640: the whole smoke DAG
    "test_workflow.py",  # ~540: ~40 Snakemake dry runs and two real slices
    "test_slurm.py",  # ~400: a local SLURM cluster
    "test_archive.py",  # ~230
    "test_gpu_memory_simulate.py",  # ~130
    "test_distributed.py",  # ~160
    "test_workflow_vllm.py",  # vLLM venv: ~180
    "test_distributed_vllm.py",  # ~130
    "test_preflight_vllm.py",  # ~85
    "test_evaluate_vllm.py",  # ~55
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
