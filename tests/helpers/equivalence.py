"""Equal torch thread counts for equivalence runs (pipelined vs single-process reference)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

EQUIVALENCE_THREADS = 1
"""torch threads in every rank and in the single-process reference of an equivalence test.

CPU kernels (conv and matmul weight gradients) split their reductions by thread, so a different
thread count changes float32 summation order; with the same count, shapes and order, a pipelined
run and the reference compute the same bits."""


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch threads, restoring the previous count after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
