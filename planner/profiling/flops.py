"""A layer's forward FLOPs, counted by torch's own counter (the profile's `flops` column).

torch.utils.flop_counter counts the matrix products and attention kernels an op dispatches. It
counts the CUDA attention kernels but not the CPU flash kernel scaled_dot_product_attention uses
on a CPU, so that one is added here with torch's own formula for it. The count is information
(the analytic model and the reports read it), never a reason to fail a profile: where the
counter cannot run, the layer counts 0 and the failure is recorded (count_failures), so that the
profile names the layer (uncounted_meta) and MFU says it leaves that layer out. Torch releases
older than pytorch/pytorch#177169 (March 2026) fail this way on every grouped-query attention
layer: their sdpa_flop_count asserts that query, key and value have as many heads.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import numpy as np
import torch

from planner.cost.model_flops import UNCOUNTED_FLOPS_KEY

__all__ = ["count_forward_flops", "count_failures", "uncounted_meta"]

# Where count_forward_flops records why a count failed. A context variable rather than a return
# value: measure_layer keeps the count as the int of its flops column, and the profiler, which
# knows the layer, only needs to know that the count failed.
_failures: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("flop_count_failures", default=None)


def _cpu_flash_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flop_counter() -> Any:
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    extra = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None and op not in flop_registry:
        extra[op] = _cpu_flash_flops
    return FlopCounterMode(display=False, custom_mapping=extra)


def count_forward_flops(forward: Callable[[], Any]) -> int:
    """Forward FLOPs of `forward()`, without a graph where torch's counter allows (0 where it
    fails, with the reason recorded for count_failures).

    Its module tracker hooks the backward of every module input, which fails on a view of a
    received tensor made under no_grad (a transposed sequence): then count with a graph.
    """
    error: Exception | None = None
    for grad in (False, True):
        try:
            with torch.set_grad_enabled(grad), _flop_counter() as counter:
                forward()
            return int(counter.get_total_flops())
        except Exception as e:  # noqa: BLE001 - the count is information, not a reason to fail a profile
            error = e
    failures = _failures.get()
    if failures is not None:
        failures.append(f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")
    return 0


@contextlib.contextmanager
def count_failures() -> Iterator[list[str]]:
    """Within it, why each count_forward_flops that gave up failed (one line each)."""
    failures: list[str] = []
    token = _failures.set(failures)
    try:
        yield failures
    finally:
        _failures.reset(token)


def uncounted_meta(flops: np.ndarray) -> dict[str, str]:
    """The metadata line naming the layers (rows of the profiler's `flops` column) whose count
    failed at some size, which the profiler marks NaN; zeroes them, as the file has always held."""
    failed = np.isnan(flops)
    rows = np.flatnonzero(failed.any(axis=1))
    flops[failed] = 0.0
    return {UNCOUNTED_FLOPS_KEY: ",".join(map(str, rows))} if rows.size else {}
