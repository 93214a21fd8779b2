"""The allocator's peak over one layer's forward and backward: the profile's cuda_peak_bytes and
the peak its workspace_bytes is taken from (planner.profiling.measure).

The peak is above what was allocated before the forward (the layer's input, its parameters and
their gradients), on CUDA from the caching allocator, on a CPU from torch's CPU allocator as
torch.profiler counts it (planner.profiling.allocpeak).

What the forward returns stays referenced until the backward has ended, as in a pipeline: torch's
stage keeps a micro-batch's outputs in its forward cache until that micro-batch's backward, the
last stage's logits included, which a cross-entropy loss does not save (its log-softmax is what it
saves). A measurement that let the outputs go before the backward missed one output's bytes at
the backward's worst moment: a traced language model under cross-entropy (its layers take and
return tuples) recorded a head workspace of 1.0 MB where the Sequential form of the same model
recorded 2.0 MB (logits, log-softmax and both backward temporaries alive at once), and its last
rank ran 24% above the prediction under 1F1B (5.06 MiB measured, 4.07 predicted; 2 ranks, 8
micro-batches of 8 x 16 tokens, vocabulary 2,000). Held, both forms record 2,048,004 bytes and the
prediction is 5.05 MiB (+0.3%; GPipe: +5.6% before, 0.0% after).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

__all__ = ["allocator_peak_of", "forward_backward_peak"]


def _cuda_peak_of(run: Callable[[], None], device: torch.device) -> int:
    """Allocator peak above the starting point while `run` runs, on a CUDA device."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return max(int(torch.cuda.max_memory_allocated(device) - base), 0)


def allocator_peak_of(run: Callable[[], None], device: torch.device) -> int:
    """Allocator peak above the starting point while `run` runs: CUDA's caching allocator, or
    torch's CPU allocator as torch.profiler counts it."""
    if device.type == "cuda":
        return _cuda_peak_of(run, device)
    from planner.profiling.allocpeak import peak_above_start

    return peak_above_start(run)


def forward_backward_peak(forward: Callable[[], Any], roots_of: Callable[[Any], Sequence[torch.Tensor]],
                          grads: Sequence[torch.Tensor] | None, device: torch.device) -> int:
    """allocator_peak_of one `forward()` and the backward from `roots_of(its result)` (the loss, or
    the outputs that require grad) seeded with `grads` (None: a loss). The forward's whole result
    (outputs and loss) is held until the backward ends (module docstring). No backward runs when
    a root does not require grad (a layer without parameters on data)."""
    def run() -> None:
        result = forward()  # referenced until run() returns: the runtime holds the outputs through the backward
        roots = list(roots_of(result))
        if roots and all(r.requires_grad for r in roots):
            torch.autograd.backward(roots, grads)

    return allocator_peak_of(run, device)
