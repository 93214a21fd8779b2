"""A layer's forward FLOPs, counted by torch's own counter (the profile's `flops` column).

torch.utils.flop_counter counts the matrix products and attention kernels an op dispatches. It
counts the CUDA attention kernels but not the CPU flash kernel scaled_dot_product_attention uses
on a CPU, so that one is added here with torch's own formula for it. The count is information
(the analytic model and the reports read it), never a reason to fail a profile: where the
counter cannot run, the layer counts 0.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["count_forward_flops"]


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
    """Forward FLOPs of `forward()`, without a graph where torch's counter allows (0 where it fails).

    Its module tracker hooks the backward of every module input, which fails on a view of a
    received tensor made under no_grad (a transposed sequence): then count with a graph.
    """
    for grad in (False, True):
        try:
            with torch.set_grad_enabled(grad), _flop_counter() as counter:
                forward()
            return int(counter.get_total_flops())
        except Exception:  # noqa: BLE001 - the count is information, not a reason to fail a profile
            continue
    return 0
