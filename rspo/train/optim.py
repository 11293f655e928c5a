"""The optimiser and learning-rate schedule of an RL run.

AdamW over the fp32 master parameters (rspo.train.precision), two parameter groups: the router
weights (``mlp.gate.weight``) get ``lr * optim.router_lr_mult`` (1 in the paper's setting; the
small study's stress regime raises it), everything else ``lr``. Schedule: linear warmup over
``optim.warmup_steps`` optimiser updates, then constant (verl's default; the paper gives no lr).
Under FSDP2 the optimizer steps per tensor (``foreach=False``): sharded DTensors and the plain
zero-size parameters FSDP leaves replicated cannot share a foreach kernel.
"""

from __future__ import annotations

import torch

from rspo.config import OptimConfig
from rspo.router import moe_gates


def build_optimizer(
    model: torch.nn.Module, o: OptimConfig, *, sharded: bool
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    router_params = {id(gate.weight) for gate in moe_gates(model)}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named if id(p) not in router_params]
    routers = [p for _, p in named if id(p) in router_params]
    groups = [{"params": params}] + ([{"params": routers, "lr": o.lr * o.router_lr_mult}] if routers else [])
    optimizer = torch.optim.AdamW(
        groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, foreach=not sharded
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: min(1.0, (u + 1) / o.warmup_steps) if o.warmup_steps else 1.0
    )
    return optimizer, scheduler
