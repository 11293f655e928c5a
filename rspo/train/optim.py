"""The optimiser and learning-rate schedule of an RL run.

AdamW over the fp32 master parameters (rspo.train.precision), two parameter groups: the router
weights (``mlp.gate.weight``) get ``lr * optim.router_lr_mult`` (1 in the paper's setting; the
small study's stress regime raises it), everything else ``lr``. Schedule: linear warmup over
``optim.warmup_steps`` optimiser updates, then constant (verl's default; the paper gives no lr).
Not in the paper: the router's multiplier may follow a schedule in rollout steps
(``optim.router_lr_mult_final``, ``optim.router_lr_change``: a step or a linear rise; ``router_lr_mult_at``);
the trainer tells the optimizer each step's index before its updates (``RouterLr.at_step``), so a
skipped update or a resume cannot shift it.
Under FSDP2 the optimizer steps per tensor (``foreach=False``): sharded DTensors and the plain
zero-size parameters FSDP leaves replicated cannot share a foreach kernel.
"""

from __future__ import annotations

import torch

from rspo.config import OptimConfig
from rspo.router import moe_gates


def router_lr_mult_at(o: OptimConfig, step: int) -> float:
    """The router's lr multiplier at rollout step ``step`` (0-based): ``router_lr_mult`` before
    ``router_lr_change[0]``, ``router_lr_mult_final`` from ``router_lr_change[1]`` on, linear between."""
    if o.router_lr_mult_final is None:
        return o.router_lr_mult
    start, end = o.router_lr_change
    if step >= end:
        return o.router_lr_mult_final
    if step < start:
        return o.router_lr_mult
    return o.router_lr_mult + (o.router_lr_mult_final - o.router_lr_mult) * (step - start) / (end - start)


class RouterLr:
    """The router group's share of the schedule: which rollout step the updates belong to."""

    def __init__(self, o: OptimConfig) -> None:
        self.o = o
        self.step = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        """The optimizer and schedule whose router group this sets (built after this object: their
        lambdas read ``factor``)."""
        self.optimizer, self.scheduler = optimizer, scheduler

    def factor(self) -> float:
        """The router group's lr over its base (``lr * router_lr_mult``): exactly 1.0 without a schedule."""
        return router_lr_mult_at(self.o, self.step) / self.o.router_lr_mult

    def at_step(self, step: int) -> None:
        """Set the rollout step of the coming updates and the router group's lr for it."""
        self.step = step
        if self.scheduler is not None and len(self.optimizer.param_groups) > 1:
            s = self.scheduler
            self.optimizer.param_groups[1]["lr"] = s.base_lrs[1] * s.lr_lambdas[1](s.last_epoch)


def build_optimizer(
    model: torch.nn.Module, o: OptimConfig, *, sharded: bool
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, RouterLr]:
    router_params = {id(gate.weight) for gate in moe_gates(model)}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named if id(p) not in router_params]
    routers = [p for _, p in named if id(p) in router_params]
    groups = [{"params": params}] + ([{"params": routers, "lr": o.lr * o.router_lr_mult}] if routers else [])
    optimizer = torch.optim.AdamW(
        groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, foreach=not sharded
    )
    router_lr = RouterLr(o)

    def warmup(u: int) -> float:
        return min(1.0, (u + 1) / o.warmup_steps) if o.warmup_steps else 1.0

    def router(u: int) -> float:
        return warmup(u) * router_lr.factor()

    # plain functions, not objects: LambdaLR's state_dict leaves functions out (only the epoch and base lrs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, [warmup, router] if routers else warmup)
    router_lr.attach(optimizer, scheduler)
    return optimizer, scheduler, router_lr
