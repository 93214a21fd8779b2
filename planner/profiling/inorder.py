"""Each layer's time where a pipeline stage runs it: inside whole passes of the model, in order.

A layer timed alone, again and again on one input (planner.profiling.measure), runs with its
input, output and weights hot in the CPU's caches. A stage runs its layers one after another,
each on the output the previous one just wrote, and keeps every layer's saved activations until
the backward. Measured on the demo's gpt (8 blocks of hidden 128 and a 16,384-token head,
micro-batch 2, one thread, Intel Xeon, 2026-12-04): its blocks took 1.6 ms forward in order
against 1.25 ms alone, and a 2-stage 1F1B run's actions took 12.7 / 23.4 ms (stage 0, forward /
backward) and 14.0 / 23.4 ms (stage 1, the head), where the times alone predicted 9.1 / 19.5 and
12.2 / 22.0 ms and the times in order 13.2 / 26.3 and 14.1 / 24.0 ms.

So a chain model's fwd_ms and bwd_ms (and their spreads) are the medians of each layer timed
inside `repeats` whole passes after `warmup`: forward layer by layer, each on the previous one's
output detached and requiring grad (as measure_layer gets it), the loss with the last layer; then
backward layer by layer from the loss, each seeded with the input gradient the next layer gave.
The zero-bubble split keeps the proportion measured alone (bwd_input_ms / bwd_ms). A pass holds
every layer's activations of one micro-batch at once: where that would take more than half the
memory left (RAM, and the GPU's on CUDA), or an allocation fails during the passes, the size
keeps its times alone, and the profile's `layer_timing` line says which sizes.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from planner.profiling.measure import RunQueueWait, median_std, sync_for, timed_call
from planner.profiling.room import available_ram

__all__ = ["retime_in_order", "layer_timing_text", "IN_ORDER", "ALONE"]

IN_ORDER = "in model order (each layer timed inside whole forward and backward passes)"
ALONE = "each layer alone (repeated on one input)"
_ROOM_SHARE = 0.5  # a pass may take at most this share of the memory left


def layer_timing_text(alone_sizes: list[int], graph: bool) -> str:
    """The profile's `layer_timing` metadata: how its times were taken, and where not in order."""
    if graph:
        return ALONE + "; a traced non-chain model"
    if alone_sizes:
        return f"{IN_ORDER}; alone at micro-batch sizes {','.join(map(str, alone_sizes))} (a whole pass did not fit)"
    return IN_ORDER


def _pass_fits(cols: dict[str, np.ndarray], k: int, dev: torch.device) -> bool:
    """Whether one pass's activations (every layer's saved tensors, the last output, the largest
    temporaries) fit in half the memory left on the device."""
    need = float(cols["activation_bytes"][:, k].sum() + cols["output_bytes"][-1, k] + cols["workspace_bytes"][:, k].max())
    # the pass's tensors live on the device: host RAM on CPU, the GPU's memory on CUDA
    room = [int(torch.cuda.mem_get_info(dev)[0])] if dev.type == "cuda" else [available_ram()]
    return all(r is None or need <= _ROOM_SHARE * r for r in room)


def _one_pass(layers: list[torch.nn.Module], first: torch.Tensor, loss_fn: Callable[[Any, Any], torch.Tensor],
              target: Any, waits: RunQueueWait | None, sync: Callable[[], None]) -> tuple[list[float], list[float]]:
    """(forward ms, backward ms) of every layer in one forward and backward of the model."""
    n = len(layers)
    kept: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    fwd, bwd = [0.0] * n, [0.0] * n
    h = first
    for i, layer in enumerate(layers):
        inp = h if i == 0 else h.detach().requires_grad_(h.is_floating_point())

        def forward(layer: torch.nn.Module = layer, inp: torch.Tensor = inp, last: bool = i == n - 1) -> tuple[Any, Any]:
            y = layer(inp)
            return y, (loss_fn(y, target) if last else y)

        (h, root), fwd[i] = timed_call(forward, waits, sync)
        kept.append((inp, root))
    grad: torch.Tensor | None = None
    for i in reversed(range(n)):
        inp, root = kept[i]  # type: ignore[misc]
        kept[i] = None  # freed after its backward, as a stage frees a micro-batch's
        if root.requires_grad and (grad is not None or i == n - 1):
            _, bwd[i] = timed_call(lambda: torch.autograd.backward(root, grad), waits, sync)
        grad = inp.grad if inp.requires_grad else None
    return fwd, bwd


def retime_in_order(layers: list[torch.nn.Module], first: torch.Tensor, loss_fn: Callable[[Any, Any], torch.Tensor],
                    target: Any, cols: dict[str, np.ndarray], k: int, *, warmup: int, repeats: int,
                    timer: str) -> bool:
    """Replace column k's times (measured alone) by the times in order; False when a pass would
    not fit (the times alone stay)."""
    dev = first.device
    if not _pass_fits(cols, k, dev):
        return False
    sync = sync_for(dev)
    waits = RunQueueWait() if timer == "sched" else None
    samples: list[tuple[list[float], list[float]]] = []
    try:
        for r in range(warmup + max(repeats, 1)):
            one = _one_pass(layers, first, loss_fn, target, waits, sync)
            if r >= warmup:
                samples.append(one)
    except (torch.OutOfMemoryError, MemoryError):
        return False  # the estimate let a pass through that did not fit: the times alone stay
    except RuntimeError as e:
        if "allocate memory" not in str(e):  # a failed CPU allocation, as planner.profiling.profiler reads it
            raise
        return False
    finally:
        if waits:
            waits.close()
        for layer in layers:  # as measure_layer leaves them: the next size's memory checks see what is free
            layer.zero_grad(set_to_none=True)
    for i in range(len(layers)):
        fwd = [s[0][i] for s in samples]
        bwd = [s[1][i] for s in samples]
        alone_bwd, alone_input = cols["bwd_ms"][i, k], cols["bwd_input_ms"][i, k]
        # I alone timed above the whole backward is noise: the retimed B is then all I (W 0), never W < 0
        share = min(alone_input / alone_bwd, 1.0) if alone_bwd > 0 else (1.0 if alone_input > 0 else 0.0)
        cols["fwd_ms"][i, k], cols["fwd_ms_std"][i, k] = median_std(fwd)
        cols["bwd_ms"][i, k], cols["bwd_ms_std"][i, k] = median_std(bwd)
        cols["bwd_input_ms"][i, k] = share * cols["bwd_ms"][i, k]
        cols["bwd_weight_ms"][i, k] = cols["bwd_ms"][i, k] - cols["bwd_input_ms"][i, k]
    return True
