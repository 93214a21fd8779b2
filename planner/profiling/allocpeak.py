"""The CPU allocator's peak over a region (a layer's forward and backward, a training step),
counted by torch's own allocator.

On CUDA the caching allocator keeps a peak (`torch.cuda.max_memory_allocated`). torch's CPU
allocator keeps none, but while torch.profiler runs with `profile_memory=True` it reports every
allocation and free with the bytes then allocated. `CpuAllocatorMeter` starts the profiler before
the rank builds its model, so the model's weights, gradients, optimizer state, activations, the
received tensors and every temporary inside an op are counted; the step to measure runs inside
`window()`, and `stop()` returns the largest count inside it: the CPU counterpart of CUDA's peak,
measured by torch and independent of the cost model. The profiler uses it the same way around one
layer's forward and backward (`peak_above_start`).

What it does not see (said in docs/simulator.md): blocks allocated before `start()` (torch's and
the process group's own), allocations made by other threads (the profiler is per thread: a CPU
rank computes and runs autograd on its main thread), and the C library's slack around blocks,
which the resident-set growth (`measure.RssWindow`) does include.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch

__all__ = ["AllocatorPeak", "CpuAllocatorMeter", "peak_above_start", "window_peak"]

_WINDOW = "pplan::memory_step"


@dataclass(frozen=True)
class AllocatorPeak:
    """Bytes torch's CPU allocator held during the measured step."""

    peak_bytes: int
    """The most held at any moment inside the window."""
    start_bytes: int
    """Held when the window opened (weights, optimizer state, buffers kept between steps)."""
    events: int
    """Allocations and frees seen inside the window (0: nothing was allocated)."""


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Hide what the profiler library prints on its own when it starts and stops (a line per
    call on standard error, at any log level): a rank's standard error is the user's console."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


class CpuAllocatorMeter:
    """Counts torch's CPU allocations from `start()` to `stop()`; the peak is read in `window()`."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._opened = False

    def start(self) -> "CpuAllocatorMeter":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False,
                             with_stack=False)
        with _quiet_stderr():
            self._prof.__enter__()
        return self

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """The region whose peak `stop()` reports (one per meter)."""
        if self._prof is None:
            raise RuntimeError("CpuAllocatorMeter.window() before start()")
        self._opened = True
        with torch.profiler.record_function(_WINDOW):
            yield

    def stop(self) -> AllocatorPeak | None:
        """Stop counting; the window's peak, or None when no window ran."""
        if self._prof is None:
            return None
        prof, self._prof = self._prof, None
        with _quiet_stderr():
            prof.__exit__(None, None, None)
        if not self._opened:
            return None
        return window_peak(prof.profiler.kineto_results.experimental_event_tree(), _WINDOW)


def window_peak(roots: list[Any], window_name: str) -> AllocatorPeak | None:
    """The allocator's peak inside the event named `window_name`, from a profiler event tree.

    Every allocation event carries the bytes allocated after it (`total_allocated`), so the peak
    is the largest of those inside the window, or the count it opened with when nothing inside
    grew it. The count is torch's, kept across profiler sessions, and a block freed while no
    profiler ran is never taken off it: so only differences within one session mean anything,
    and a window that opens a session starts from its first event's count less that event.
    """
    window: tuple[int, int] | None = None
    allocations: list[tuple[int, int, int]] = []  # (time ns, bytes allocated after the event, its size)
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node.name == window_name and window is None:
            window = (node.start_time_ns, node.end_time_ns)
        extra = node.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation":
            allocations.append((node.start_time_ns, int(extra.total_allocated), int(extra.alloc_size)))
        stack.extend(node.children)
    if window is None:
        return None
    allocations.sort()
    start: int | None = None
    inside: list[int] = []
    for t, held, size in allocations:
        if t < window[0]:
            start = held
        elif t <= window[1]:
            if start is None:  # the count before the window's first event
                start = held - size
            inside.append(held)
    start = start or 0
    return AllocatorPeak(peak_bytes=max([start, *inside]), start_bytes=start, events=len(inside))


def peak_above_start(run: Any) -> int:
    """Bytes torch's CPU allocator held above its starting point at the peak of `run()`: what
    `run` allocated and still held at its worst moment (freed blocks allocated earlier do not
    lower it)."""
    meter = CpuAllocatorMeter().start()
    try:
        with meter.window():
            run()
    finally:
        got = meter.stop()
    return 0 if got is None else max(0, got.peak_bytes - got.start_bytes)
