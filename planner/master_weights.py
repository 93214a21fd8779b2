"""fp32 master weights for a 16-bit plan: mixed-precision training, as the cost model prices it.

Why: planner/cost/precision.py prices a bfloat16 profile as mixed-precision Adam (Megatron, the
ZeRO paper): 2 B bf16 weights + 2 B bf16 gradients + 12 B fp32 master weights, momentum and
variance per parameter. A torch optimizer stepped over bf16 parameters is pure bf16 Adam instead
(2 + 2 + 4 B) and drops every update smaller than half a bf16 step of the weight (|w| x 2^-9):
at lr 1e-3 Adam moves a weight of 1.0 by about 1e-3 a step, under 2^-9, so it never moves. So a
16-bit parameter's optimizer keeps an fp32 copy, steps that copy, and rounds it into the weight.

`with_fp32_masters(cls)` is the optimizer class `cls` (Adam, AdamW, SGD) doing that. Its
param_groups keep the model's 16-bit parameters (what ZeroRedundancyOptimizer partitions and
broadcasts, and every state dict indexes); each one's state holds "master" (fp32) beside the
algorithm's own fp32 state (exp_avg, exp_avg_sq, momentum_buffer). step(): for each chunk of
parameters, the 16-bit gradients (after the data-parallel all-reduce, which runs before the step)
become the masters' fp32 gradients, `cls`'s own step updates the masters and its state, and the
masters are rounded into the parameters. Chunks keep the fp32 gradients and the algorithm's
temporaries to those of the largest parameter at a time: no more than the profiler's step over
that parameter's layer measured (planner.profiling.optstep), which the cost model charges. float32 parameters
are their own masters (no copy): a float32 plan's optimizer is the plain class.

Checkpoints: state_dict() carries each master ("master", fp32), so a resumed run continues from
the masters, not from the rounded weights; load_state_dict keeps saved fp32 state in fp32 (torch's
casts every state tensor to its parameter's dtype). A state without masters (a save of a run
before this module) re-derives them from the loaded 16-bit weights at the first step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

__all__ = ["is_16bit", "with_fp32_masters", "MASTER_KEY"]

MASTER_KEY = "master"
"""The key of a parameter's fp32 master copy in its optimizer state."""


_CLASSES: dict[type, type] = {}


def is_16bit(t: torch.Tensor) -> bool:
    """Whether `t` is a 16-bit floating tensor (bfloat16, float16): one that trains through an fp32 master."""
    return t.dtype in (torch.bfloat16, torch.float16)


def with_fp32_masters(cls: type) -> type:
    """`cls` (a torch.optim.Optimizer class) stepping fp32 masters of 16-bit parameters (module
    docstring); its constructor is `cls`'s, so ZeroRedundancyOptimizer can build it. One class per `cls`."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"FP32Master{cls.__name__}", (_FP32Masters, cls),
                             {"__doc__": f"torch.optim.{cls.__name__} over fp32 masters of 16-bit parameters "
                                         "(planner.master_weights)."})
    return _CLASSES[cls]


class _FP32Masters:
    """The step, state_dict layout and load of with_fp32_masters' classes (a mixin before the optimizer class)."""

    state: Any
    param_groups: list[dict[str, Any]]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        try:
            for group in groups:
                for chunk in _chunks(group["params"]):
                    self._step_chunk(group, chunk)
        finally:
            self.param_groups = groups
        return loss

    def _step_chunk(self, group: dict[str, Any], chunk: list[torch.Tensor]) -> None:
        """The algorithm's step on the masters of `chunk` (one group's parameters), rounded into them."""
        masters = [self._enter(p) for p in chunk]
        try:
            # the group's settings (lr, betas) with the masters in place of its parameters
            self.param_groups = [{**group, "params": masters}]
            self._algorithm_step()
        finally:
            with torch.no_grad():
                for p, m in zip(chunk, masters):
                    if m is not p:
                        self.state[p] = self.state.pop(m)
                        self.state[p][MASTER_KEY] = m
                        m.grad = None
                        p.copy_(m)

    def _enter(self, p: torch.Tensor) -> torch.Tensor:
        """What the algorithm steps for `p`: its fp32 master (made from `p` the first time) with
        `p`'s gradient in fp32 and `p`'s state; `p` itself when it is not 16-bit."""
        if not is_16bit(p):
            return p
        state = self.state[p]
        master = state.pop(MASTER_KEY, None)
        if master is None:
            master = p.detach().to(torch.float32, copy=True)
        master.grad = None if p.grad is None else p.grad.detach().to(torch.float32)
        self.state[master] = state  # the same dict: what the algorithm adds is p's state
        return master

    def _algorithm_step(self) -> None:
        """`cls`'s step, without torch's profiling wrapper when it has one: its step hooks ran once
        around this whole step, not once per chunk."""
        step = super().step  # type: ignore[misc]
        if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
            step.__wrapped__(self)
        else:
            step()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        # torch cast every saved state tensor (but "step") to its parameter's dtype: the masters and
        # moments of a 16-bit parameter go back to the saved fp32
        saved = state_dict.get("state", {})
        indices = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(indices, params):
            if is_16bit(p) and saved.get(i):
                for key, value in saved[i].items():
                    if key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point():
                        if value.shape != p.shape:  # a file someone sent: refused at load, not mid-step
                            raise ValueError(f"saved optimizer state {key!r} has shape {tuple(value.shape)}, "
                                             f"its parameter {tuple(p.shape)}")
                        self.state[p][key] = value.to(device=p.device, dtype=torch.float32)


def _chunks(params: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of `params` of at most the largest one's elements each (a stage's chunk then
    holds no more fp32 gradients and temporaries than the profiled step of that parameter's layer;
    a fixed share of the stage, as this was first written, held more once a stage had many layers)."""
    budget = max((p.numel() for p in params), default=1)
    chunk: list[torch.Tensor] = []
    size = 0
    for p in params:
        if chunk and size + p.numel() > budget:
            yield chunk
            chunk, size = [], 0
        chunk.append(p)
        size += p.numel()
    if chunk:
        yield chunk
