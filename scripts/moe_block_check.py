"""On a GPU: which experts implementation transformers gives Qwen3-30B-A3B's MoE layer, and how fast
each runs one MoE block (router + 128 experts, top-8) forward and backward.

transformers 5.x defaults a model's experts to ``grouped_mm`` (torch's grouped GEMM) where the
model's code allows it, else ``eager`` (a loop over the experts). rspo trains in one process under
autocast over fp32 master weights and there switches the model to ``eager``
(rspo.train.precision.one_process_mixed: grouped_mm casts its input to the weights' dtype and the
kernel refuses fp32), while under torchrun FSDP2 gathers bf16 weights and keeps ``grouped_mm``. So
the cases timed here are what each layout runs:

- ``grouped_mm, bf16 weights`` (FSDP2's gathered layers: the paper_large presets);
- ``eager, bf16 weights``;
- ``eager, fp32 weights under bf16 autocast`` (one process: paper_small's one-GPU runs);
- ``grouped_mm, fp32 weights under bf16 autocast`` (what one_process_mixed avoids: expected to fail).

The block is built from the committed config (rspo/model_configs/Qwen--Qwen3-30B-A3B.json) with
random weights, one decoder layer and a small vocabulary (nothing downloaded). Time: the wall clock
between two synchronisations around forward + backward of ``--tokens`` tokens, median of
``--repeats`` after two warm-ups. FLOPs: the routed experts' three matrix products, 2 * tokens *
top_k * 3 * hidden * moe_intermediate forward, three times that forward + backward (the router's are
under 0.1% and left out). One JSON line per case, then a summary line.

    python scripts/moe_block_check.py [--tokens 16384 --repeats 5]   # scripts/device_checks.sh
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "rspo" / "model_configs" / "Qwen--Qwen3-30B-A3B.json"
CASES = (  # (experts implementation, weights' dtype, autocast)
    ("grouped_mm", "bfloat16", False),
    ("eager", "bfloat16", False),
    ("eager", "float32", True),
    ("grouped_mm", "float32", True),
)


def block_flops(config: dict, tokens: int) -> float:
    """Forward + backward FLOPs of the routed experts for ``tokens`` tokens (module docstring)."""
    forward = 2 * tokens * config["num_experts_per_tok"] * 3 * config["hidden_size"] * config["moe_intermediate_size"]
    return 3.0 * forward


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda (the check); cpu only to test the script")
    ap.add_argument("--experts", type=int, default=None, help="fewer experts (to test the script on a CPU)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    raw = json.loads(CONFIG.read_text())
    if args.experts:
        raw.update(num_experts=args.experts, num_experts_per_tok=min(raw["num_experts_per_tok"], args.experts))
    config = Qwen3MoeConfig(
        **{**raw, "num_hidden_layers": 1, "vocab_size": 256, "bos_token_id": None, "eos_token_id": None}
    )
    torch.manual_seed(0)
    dev = torch.device(args.device)
    with dev:
        model = Qwen3MoeForCausalLM(config)
    default = model.config._experts_implementation
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    print(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "gpu": name,
                "default_experts_implementation": default,
            }
        ),
        flush=True,
    )
    if dev.type == "cuda":  # the GPU's practical ceiling: a large bf16 matrix product
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        matmul = 2 * 8192**3 * 10 / (time.perf_counter() - t0)
        print(json.dumps({"bf16_matmul_8192_tflops": round(matmul / 1e12, 1)}), flush=True)
        del a, b
    block = model.model.layers[0].mlp
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    flops = block_flops(raw, args.tokens)
    rows = []
    for impl, dtype, autocast in CASES:
        row = {"experts": impl, "weights": dtype, "autocast_bf16": autocast, "tokens": args.tokens}
        try:
            model.set_experts_implementation(impl)
            block.to(getattr(torch, dtype))
            x = torch.randn(1, args.tokens, raw["hidden_size"], device=dev, dtype=torch.bfloat16)
            x = x.to(getattr(torch, dtype)).requires_grad_(True)
            ctx = torch.autocast(dev.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            times = []
            for i in range(2 + args.repeats):
                sync()
                t0 = time.perf_counter()
                with ctx:
                    y = block(x)
                y.float().square().mean().backward()
                sync()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
                block.zero_grad(set_to_none=True)
                x.grad = None
            s = statistics.median(times)
            row.update(ok=True, seconds=round(s, 5), tflops=round(flops / s / 1e12, 1))
        except Exception as e:  # the refused case says why
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok = {(r["experts"], r["weights"]): r for r in rows if r["ok"]}
    g, e, a = ok.get(("grouped_mm", "bfloat16")), ok.get(("eager", "bfloat16")), ok.get(("eager", "float32"))
    print(
        json.dumps(
            {
                "default_experts_implementation": default,
                "eager_over_grouped_mm_bf16": round(e["seconds"] / g["seconds"], 2) if g and e else None,
                "one_process_autocast_eager_over_grouped_mm_bf16": round(a["seconds"] / g["seconds"], 2)
                if g and a
                else None,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
