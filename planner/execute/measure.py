"""What a rank measures while it trains: action times, recompute time and activation memory.

Action times come from wrapping each PipelineStage's `forward_one_chunk` (F, with the loss of the
last stage added), `backward_one_chunk` (B, or I when the backward is split) and
`backward_weight_one_chunk` (W). Those are the calls torch's schedules make for compute; the
waits for received tensors happen outside them, so an action's duration is compute only.
Recompute (activation checkpointing) is timed inside the checkpointed layers while a backward
runs and reported as an R row just before its B/I, as the simulator does.

Activation memory on CPU is tracked with autograd's saved_tensors_hooks: every tensor an op
saves for backward is counted once per storage while the graph holds it (parameters and the
input batch excluded, as the profiler does). Checkpointed layers save nothing visible to these
hooks, so their kept input is registered explicitly, and during their recompute the layer's
activations (measured once, un-checkpointed) count as a transient.

Process memory (CPU, Linux) is measured independently of the cost model by `RssWindow`: the
resident set before the model is built (`mark_baseline`, torch and the process group already
there), and the kernel's high-water mark over one step (VmHWM, reset at the step's start by
writing 5 to /proc/self/clear_refs). Their difference is everything the rank's model, training
state, activations, torch's temporaries and the allocator's slack added, as the OS sees it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from planner.profiling.saved import SavedTensorHooks, storage_key
from planner.torch_compat import private_attr

__all__ = ["Event", "ActionRecorder", "MemoryTracker", "RssWindow", "recorder", "tracker", "set_tracker",
           "read_rss", "mark_baseline", "baseline_rss"]


@dataclass
class Event:
    """One timed action on this rank, seconds on the perf_counter clock."""

    stage: int
    """Global stage index."""
    kind: str
    """F, B, I, W, R or O."""
    microbatch: int
    """Micro-batch index (-1 for O)."""
    start: float
    """perf_counter() at the start."""
    end: float
    """perf_counter() at the end."""
    cpu_ms: float = 0.0
    """CPU time this thread spent in the action, ms: the wall time minus waiting for a CPU (and
    for other threads), so a loaded machine shows as wall time above it."""


class ActionRecorder:
    """Collects the events of the current step; wraps stages so their compute is timed."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.sync: Callable[[], None] = lambda: None
        """Called before reading the clock (torch.cuda.synchronize on GPU)."""
        self._backward: Event | None = None
        self._recompute_s = 0.0

    def clear(self) -> None:
        self.events = []

    def _now(self) -> float:
        self.sync()
        return time.perf_counter()

    def record(self, stage: int, kind: str, microbatch: int, fn: Callable[[], Any]) -> Any:
        """Run `fn` as action (stage, kind, microbatch) and keep its start and end."""
        start = self._now()
        cpu0 = time.thread_time()
        is_bwd = kind in ("B", "I", "W")
        if is_bwd:
            self._recompute_s = 0.0
            self._backward = Event(stage, kind, microbatch, start, start)
        try:
            return fn()
        finally:
            end = self._now()
            cpu_ms = (time.thread_time() - cpu0) * 1e3
            if is_bwd:
                self._backward = None
                rec = self._recompute_s
                if rec > 0:  # the recompute ran inside this backward: its own row first
                    # its CPU share is not measured apart: counted at its wall time, capped
                    rec_cpu = min(rec * 1e3, cpu_ms)
                    self.events.append(Event(stage, "R", microbatch, start, start + rec, rec_cpu))
                    start += rec
                    cpu_ms -= rec_cpu
                tk = tracker()
                if tk is not None:
                    tk.set_transient(0)
            self.events.append(Event(stage, kind, microbatch, start, end, cpu_ms))

    def in_backward(self) -> bool:
        return self._backward is not None

    def add_recompute(self, seconds: float) -> None:
        self._recompute_s += seconds

    def extend_forward(self, stage: int, microbatch: int, fn: Callable[[], Any]) -> Any:
        """Run `fn` (the loss of the last stage) and add its time to that F's event."""
        try:
            return fn()
        finally:
            end = self._now()
            for ev in reversed(self.events):
                if ev.stage == stage and ev.kind == "F" and ev.microbatch == microbatch:
                    ev.end = max(ev.end, end)
                    break

    def wrap_stage(self, stage: Any) -> None:
        """Patch a PipelineStage instance so its compute calls are recorded."""
        idx = stage.stage_index
        fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            return self.record(idx, "F", chunk, lambda: fwd(chunk, *args, **kwargs))

        def backward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return self.record(idx, "B" if full else "I", chunk, lambda: bwd(chunk, *args, **kwargs))

        def backward_weight_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            return self.record(idx, "W", chunk, lambda: bwd_w(chunk, *args, **kwargs))

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def wrap_loss(self, schedule: Any) -> None:
        """Patch a schedule so the last stage's loss counts as part of its forward."""
        compute = private_attr(schedule, "_maybe_compute_loss", "torch")

        def _maybe_compute_loss(stage: Any, output: Any, target_mbs: Any, mb_index: int, *rest: Any) -> Any:
            # torch calls this on every stage, after the forward's send is posted: only the last
            # stage computes a loss, so only there does the call belong to the forward's time.
            if not stage.is_last:
                return compute(stage, output, target_mbs, mb_index, *rest)
            return self.extend_forward(stage.stage_index, mb_index,
                                       lambda: compute(stage, output, target_mbs, mb_index, *rest))

        schedule._maybe_compute_loss = _maybe_compute_loss


class _Held:
    """What autograd stores instead of a tracked tensor: releases its bytes when freed."""

    __slots__ = ("tensor", "key", "owner")

    def __init__(self, tensor: torch.Tensor, key: Any, owner: "MemoryTracker"):
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self) -> None:
        self.owner._release(self.key)


class MemoryTracker(SavedTensorHooks):
    """Live and peak bytes of saved activations (per storage) on this rank."""

    def __init__(self, exclude: Iterable[torch.Tensor] = (), transient_bytes: dict[int, int] | None = None):
        super().__init__(exclude)
        self._refs: dict[Any, list[int]] = {}  # storage -> [holders, bytes]
        self.live = 0
        self.transient = 0
        self.peak = 0
        self.peak_transient = 0
        self.transient_bytes: dict[int, int] = {} if transient_bytes is None else transient_bytes
        """id(checkpointed layer) -> its activations, measured once without checkpointing (shared
        between trackers so the measuring forward runs in an earlier step than the measured one)."""

    def probe(self, exclude: Iterable[torch.Tensor]) -> "MemoryTracker":
        """A fresh tracker of the same way of counting (a layer's recompute-transient probe)."""
        return MemoryTracker(exclude=exclude)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._exclude.update(storage_key(t)[0] for t in tensors)

    def pack(self, t: torch.Tensor) -> Any:
        key, nbytes = storage_key(t)  # counted per storage, as `pplan profile` counts
        if key in self._exclude:
            return t
        ref = self._refs.get(key)
        if ref is None:
            self._refs[key] = [1, nbytes]
            self.live += nbytes
            self._update_peak()
        else:
            ref[0] += 1
        # Held without its autograd history: a tensor an op saves of its own output points back to
        # that op's node, which holds this object, a cycle Python's collector cannot see through.
        # A graph never run backward (torch's first-step metadata inference) then stays alive,
        # with every activation it saved, for the rest of the run.
        return _Held(t.detach(), key, self)

    def unpack(self, packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def _release(self, key: Any) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[key]

    def set_transient(self, nbytes: int) -> None:
        self.transient = nbytes
        self._update_peak()

    def _update_peak(self) -> None:
        if self.live + self.transient > self.peak:
            self.peak = self.live + self.transient
            self.peak_transient = self.transient


_RECORDER = ActionRecorder()
_TRACKER: list[MemoryTracker | None] = [None]


def recorder() -> ActionRecorder:
    """The process's recorder (one rank per process)."""
    return _RECORDER


def tracker() -> MemoryTracker | None:
    """The active memory tracker, or None when memory is not being tracked."""
    return _TRACKER[0]


def set_tracker(t: MemoryTracker | None) -> None:
    _TRACKER[0] = t


_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def read_rss(status_path: str = _STATUS) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of this process in bytes from /proc, or None where /proc has no such lines."""
    rss = hwm = None
    try:
        with open(status_path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    parts = value.split()
                    if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                        if key == "VmRSS":
                            rss = int(parts[0]) * 1024
                        else:
                            hwm = int(parts[0]) * 1024
    except OSError:
        return None
    return None if rss is None or hwm is None else (rss, hwm)


def _reset_hwm(path: str = _CLEAR_REFS) -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0); False if refused."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"5")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


_BASELINE: list[int | None] = [None]


def mark_baseline() -> int | None:
    """Remember this process's RSS now (call before the model is built); returns it."""
    got = read_rss()
    _BASELINE[0] = got[0] if got else None
    return _BASELINE[0]


def baseline_rss() -> int | None:
    """The RSS `mark_baseline` recorded (None when not marked or not on Linux)."""
    return _BASELINE[0]


class RssWindow:
    """The process's peak resident set over a window (one training step), from the kernel.

    `begin()` resets the high-water mark; `end()` reads it. `growth_bytes` is that peak minus the
    baseline marked before the model was built: the rank's memory as the OS sees it, independent
    of the tensor sizes the cost model counts (it also holds torch's temporaries inside ops, the
    allocator's slack and freed memory the C library keeps). None where /proc cannot tell.
    """

    def __init__(self, baseline: int | None = None):
        self.baseline = baseline_rss() if baseline is None else baseline
        self.start_rss: int | None = None
        self.peak_rss: int | None = None
        self._reset = False

    def begin(self) -> "RssWindow":
        self._reset = _reset_hwm()
        got = read_rss()
        self.start_rss = got[0] if got else None
        return self

    def end(self) -> "RssWindow":
        got = read_rss()
        if got is not None and self._reset:
            self.peak_rss = max(got)
        return self

    @property
    def growth_bytes(self) -> int | None:
        if self.peak_rss is None or self.baseline is None:
            return None
        return max(0, self.peak_rss - self.baseline)

    def to_dict(self) -> dict[str, int | None]:
        return {"rss_baseline_bytes": self.baseline, "rss_step_start_bytes": self.start_rss,
                "rss_step_peak_bytes": self.peak_rss, "rss_growth_bytes": self.growth_bytes}
