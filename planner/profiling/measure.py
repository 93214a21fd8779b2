"""Measuring one layer: forward/backward times, saved activations, output size, flops.

Method (docs/profile-format.md repeats it for users):
- The layer runs in training mode on its real input (the previous layer's output, detached
  and marked requires_grad, as a pipeline stage receives it; the first layer's input is the
  data and needs no gradient). The last layer's forward includes the loss.
- fwd_ms / bwd_ms are medians over `repeats` runs after `warmup` runs of the layer alone (a
  chain model's profile then takes them inside whole passes, planner.profiling.inorder); on CUDA the device is
  synchronised around each run. With the `sched` timer (default where Linux reports it) each
  run's wall time has the time this thread spent runnable but waiting for a CPU subtracted
  (the run-queue delay in /proc/thread-self/schedstat): what other processes cost the
  measurement, not the layer. Exact with one torch thread; with several, only the calling
  thread's waits are removed. Backward runs on one retained graph with a fixed random
  output gradient; gradients accumulate from run to run, as they do for every micro-batch
  after the first (allocating fresh parameter gradients each run would time page faults).
- bwd_input_ms is the median of autograd.grad with respect to the layer input alone (the
  zero-bubble I step); bwd_weight_ms = bwd_ms - bwd_input_ms, the rest of the work (W).
  Timing W alone would repeat the activation-gradient chain inside the layer, which a real
  split backward computes once. A first layer (input needs no gradient) is all W, a layer
  without parameters all I.
- activation_bytes: storages saved for backward (planner.profiling.saved), the layer's own
  input included when saved (backward needs it), parameters and buffers excluded.
  shared_input_bytes: the part of it the previous layer saved too (its output, e.g. a ReLU
  result, saved again as this layer's input): within one stage it is held once.
- flops: torch.utils.flop_counter over one forward without a graph (0 where it counts nothing;
  planner.profiling.flops).
- cuda_peak_bytes: on CUDA, the allocator's peak during one forward+backward above what was
  allocated before it (gradients it creates included), the layer's outputs (and the loss) held
  until the backward ends, as torch's stage holds them (planner.profiling.layerpeak).
- workspace_bytes: that peak, on CUDA from the caching allocator and on CPU from torch's CPU
  allocator (torch.profiler's memory events, planner.profiling.allocpeak), less the bytes the
  layer saves for backward and its output (less only what the peak counted: the layer's input
  was allocated before it, so the part of the input the layer saves is not taken off; profiles
  made before input_saved_bytes existed took it off): what else is alive at the layer's worst moment (the
  gradients flowing through it, the temporaries inside its ops; with cross-entropy, the
  gradients of the log-softmax and of the logits; the profiler passes the loss as the run
  computes it, planner.profiling.stageloss). Parameter gradients already exist, as after a
  pipeline's first micro-batch.
  output_saved_bytes: the part of the output the layer saves itself (a ReLU's, a softmax's).
  input_saved_bytes: the part of the layer's input it saves itself (a Linear's, a convolution's).
  On a stage's first layer that input is the buffer torch's stage received it into, which the
  runtime holds anyway.
- wgrad_bytes: what zero-bubble's I keeps alive for W beyond the saved tensors; w_workspace_bytes:
  the allocator's peak during the layer's W right after its I, parameter gradients already there;
  w_carry_bytes: the gradients of its last parameter group (planner.profiling.split_backward).
- A layer of a traced non-chain model (planner.graph) takes a tuple of inputs and returns a
  tuple of outputs: the same method, with one fixed random gradient per output that
  requires grad (seeds grad_seed, grad_seed + 1, ...) and bwd_input_ms taken with respect to
  every input that requires grad. Its output_bytes here count all outputs; the profiler keeps
  only the chain part.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from planner.errors import ModelSpecError
from planner.profiling.flops import count_forward_flops
from planner.profiling.layerpeak import forward_backward_peak
from planner.profiling.saved import SavedTensors, tensor_bytes
from planner.profiling.split_backward import SplitBackwardBytes, split_backward_bytes

__all__ = ["LayerMeasurement", "RunQueueWait", "measure_layer", "timed_ms", "sync_for", "median_std", "timed_call"]


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer at one micro-batch size."""

    fwd_ms: float
    """Median forward time, ms."""
    fwd_ms_std: float
    """Standard deviation of the forward samples, ms."""
    bwd_ms: float
    """Median full backward time, ms."""
    bwd_ms_std: float
    """Standard deviation of the backward samples, ms."""
    bwd_input_ms: float
    """Input-gradient part of the backward, ms."""
    bwd_weight_ms: float
    """Weight-gradient part of the backward, ms (bwd_ms - bwd_input_ms)."""
    activation_bytes: int
    """Bytes saved for backward (distinct storages, no parameters)."""
    shared_input_bytes: int
    """Bytes of those that the previous layer saved too."""
    output_bytes: int
    """Bytes of the layer's output."""
    flops: int
    """Forward floating-point operations (0 when not countable)."""
    cuda_peak_bytes: int
    """Allocator peak above the starting point during forward+backward (0 off CUDA)."""
    workspace_bytes: int = 0
    """That peak (CPU or CUDA allocator) less activation_bytes and output_bytes: gradients and temporaries."""
    output_saved_bytes: int = 0
    """Bytes of the output that the layer itself saves for backward (counted in activation_bytes)."""
    input_saved_bytes: int = 0
    """Bytes of the layer's input that it saves for backward (counted in activation_bytes)."""
    wgrad_bytes: int = 0
    """Bytes zero-bubble's input backward keeps for the weight backward (planner.profiling.split_backward)."""
    w_workspace_bytes: int = 0
    """The allocator's peak during the layer's weight backward alone, its gradients already there (split_backward)."""
    w_carry_bytes: int = 0
    """Bytes of the weight gradients of the layer's last parameter group, which W keeps into the next (split_backward)."""


def sync_for(device: torch.device) -> Callable[[], None]:
    """What waits for the device before a clock is read: CUDA synchronises, the CPU needs nothing."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class RunQueueWait:
    """Milliseconds the calling thread has spent runnable but not running (Linux schedstat).

    `available` is False where the kernel does not report it; `ms()` then returns 0.
    """

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self.ms()
        except (OSError, ValueError, IndexError):
            self.close()

    @property
    def available(self) -> bool:
        return self._fd is not None

    def ms(self) -> float:
        if self._fd is None:
            return 0.0
        # fields: ns on the CPU, ns waiting on a run queue, time slices
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e6

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
        self._fd = None


def timed_ms(fn: Callable[[], Any], *, warmup: int, repeats: int, sync: Callable[[], None],
             before: Callable[[], None] | None = None, timer: str = "sched") -> list[float]:
    """Times of `repeats` calls of fn after `warmup` calls, ms (see module docstring for timers).

    fn's result is dropped only after the clock stops: freeing a graph is not the forward.
    """
    waits = RunQueueWait() if timer == "sched" else None
    samples = []
    try:
        for i in range(warmup + repeats):
            if before is not None:
                before()
            result, ms = timed_call(fn, waits, sync)
            del result
            if i >= warmup:
                samples.append(ms)
    finally:
        if waits:
            waits.close()
    return samples


def timed_call(fn: Callable[[], Any], waits: "RunQueueWait | None", sync: Callable[[], None]) -> tuple[Any, float]:
    """(fn's result, the call's time in ms less the run-queue wait that fell inside it): one run
    of timed_ms, also what planner.profiling.inorder times each layer of a pass with."""
    sync()
    outer0 = time.perf_counter()
    w0 = waits.ms() if waits else 0.0
    t0 = time.perf_counter()
    result = fn()
    sync()
    t1 = time.perf_counter()
    w1 = waits.ms() if waits else 0.0
    outer1 = time.perf_counter()
    return result, _sample_ms(t1 - t0, outer1 - outer0, w1 - w0)


def _sample_ms(timed_s: float, outer_s: float, waited_ms: float) -> float:
    """One run's time, ms: `timed_s` between the clock's reads around the call, minus the part of
    the run-queue wait `waited_ms` (counted between reads just outside them, `outer_s` apart) that
    fell inside. The wait counter cannot be read inside the timed window without adding its cost to
    every run, so a wait that lands between a counter read and a clock read is counted but not
    timed: subtracting it whole once made a 0.5 ms block read 0 ms. Such a wait lengthens the outer
    window alone, so at most outer - timed of the count lies outside; subtract the rest."""
    timed_ms = timed_s * 1e3
    outside_ms = max(outer_s - timed_s, 0.0) * 1e3
    return max(timed_ms - max(waited_ms - outside_ms, 0.0), 0.0)


def median_std(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return 0.0, 0.0
    return statistics.median(samples), statistics.stdev(samples) if len(samples) > 1 else 0.0


def _summary(fwd: list[float], bwd: list[float], bwd_input: float, saved: Any, prev_saved: Any,
             output_bytes: int, flops: int, cuda_peak: int, peak: int = 0,
             output_saved: int = 0, input_saved: int = 0, split: SplitBackwardBytes = SplitBackwardBytes()) -> "LayerMeasurement":
    """Medians and spreads of the timed runs plus the byte counts, as one LayerMeasurement."""
    fwd_med, fwd_std = median_std(fwd)
    bwd_med, bwd_std = median_std(bwd)
    return LayerMeasurement(
        fwd_ms=fwd_med, fwd_ms_std=fwd_std, bwd_ms=bwd_med, bwd_ms_std=bwd_std,
        bwd_input_ms=bwd_input, bwd_weight_ms=max(bwd_med - bwd_input, 0.0),
        activation_bytes=saved.total_bytes, shared_input_bytes=saved.shared_bytes(prev_saved),
        output_bytes=output_bytes, flops=flops, cuda_peak_bytes=cuda_peak,
        # the output counts once: in activation_bytes where the layer saves it, else on its own; the
        # input existed before the peak was taken, so the part of it the layer saves is not in the peak
        workspace_bytes=max(0, peak - (saved.total_bytes - input_saved)
                            - (output_bytes - min(output_bytes, output_saved))) if peak else 0,
        output_saved_bytes=min(output_bytes, output_saved),
        input_saved_bytes=input_saved, wgrad_bytes=split.wgrad_bytes,
        w_workspace_bytes=split.w_workspace_bytes, w_carry_bytes=split.w_carry_bytes,
    )


def _output_gradient(out: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out.shape, generator=g).to(device=out.device, dtype=out.dtype)


def measure_layer(
    layer: torch.nn.Module,
    inp: torch.Tensor | tuple,
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    target: Any = None,
    warmup: int = 2,
    repeats: int = 5,
    grad_seed: int = 0,
    prev_saved: SavedTensors | None = None,
    name: str = "layer",
    timer: str = "sched",
) -> tuple[LayerMeasurement, torch.Tensor, SavedTensors]:
    """Measure `layer` on `inp` (see module docstring).

    With `loss_fn`, the layer is the last one: its forward includes `loss_fn(output, target)`
    and its backward starts from the loss. Returns the measurement, the layer's output
    (detached, sharing storage with what the layer saved) and the saved-tensor record, which
    the caller passes as `prev_saved` to the next layer and then releases.

    With a tuple `inp` the layer is called as layer(*inp) and must return a tuple (a traced
    layer, planner.graph); the loss then takes its first output, and the returned output is
    the tuple, each tensor detached.
    """
    if isinstance(inp, tuple):
        return _measure_multi(layer, inp, loss_fn=loss_fn, target=target, warmup=warmup, repeats=repeats,
                              grad_seed=grad_seed, prev_saved=prev_saved, name=name, timer=timer)
    sync = sync_for(inp.device)
    params = [p for p in layer.parameters() if p.requires_grad]

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        y = layer(inp)
        return (y, loss_fn(y, target)) if loss_fn is not None else (y, y)

    saved = SavedTensors(exclude=[*layer.parameters(), *layer.buffers()])
    with saved:
        y, out = forward()
    if not isinstance(y, torch.Tensor):
        raise ModelSpecError(f"layer {name!r} returns {type(y).__name__}, not a tensor", "each pipeline layer must return one tensor")
    # Counted in a pass of its own: the counter hooks every module's backward, and the graph
    # above is the one whose backward is timed. No graph is needed to count a forward.
    flops = count_forward_flops(forward)
    fwd = timed_ms(forward, warmup=warmup, repeats=repeats, sync=sync, timer=timer)

    bwd: list[float] = []
    bwd_input, cuda_peak, grad = 0.0, 0, None
    if out.requires_grad:
        grad = None if loss_fn is not None else _output_gradient(out, grad_seed)
        bwd, bwd_input = _time_backward(out, grad, [inp] if inp.requires_grad else [], params,
                                        warmup=warmup, repeats=repeats, sync=sync, timer=timer)
    peak = forward_backward_peak(forward, lambda result: [result[1]], None if grad is None else [grad], inp.device)
    if inp.device.type == "cuda":
        cuda_peak = peak
        for t in params + [inp]:
            t.grad = None
    split = split_backward_bytes([forward()[1]], None if grad is None else [grad], [inp], params, inp.device) \
        if out.requires_grad else SplitBackwardBytes()
    m = _summary(fwd, bwd, bwd_input, saved, prev_saved, tensor_bytes(y), flops, cuda_peak, peak,
                 saved.held_bytes_of([y]), saved.held_bytes_of([inp]), split)
    return m, y.detach(), saved


def _measure_multi(layer: torch.nn.Module, inputs: tuple, *, loss_fn: Callable[[Any, Any], torch.Tensor] | None,
                   target: Any, warmup: int, repeats: int, grad_seed: int, prev_saved: SavedTensors | None,
                   name: str, timer: str) -> tuple[LayerMeasurement, tuple, SavedTensors]:
    """measure_layer for a layer with a tuple of inputs and outputs (same method, module docstring)."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    device = tensors[0].device if tensors else next((p.device for p in layer.parameters()), torch.device("cpu"))
    sync = sync_for(device)
    params = [p for p in layer.parameters() if p.requires_grad]
    grad_inputs = [t for t in tensors if t.requires_grad]

    def forward() -> tuple[Any, Any]:
        y = layer(*inputs)
        return (y, loss_fn(y[0], target)) if loss_fn is not None else (y, y)

    saved = SavedTensors(exclude=[*layer.parameters(), *layer.buffers()])
    with saved:
        y, out = forward()
    if not isinstance(y, tuple):
        raise ModelSpecError(f"layer {name!r} returns {type(y).__name__}, not a tuple of outputs", "build traced layers with planner.graph (LayerGraph.layer_module)")
    flops = count_forward_flops(forward)
    fwd = timed_ms(forward, warmup=warmup, repeats=repeats, sync=sync, timer=timer)
    if loss_fn is not None:
        roots = [out] if out.requires_grad else []
        grads: list[torch.Tensor] | None = None
    else:
        roots = [t for t in y if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = [_output_gradient(t, grad_seed + k) for k, t in enumerate(roots)]
    bwd: list[float] = []
    bwd_input, cuda_peak = 0.0, 0
    if roots:
        bwd, bwd_input = _time_backward(roots, grads, grad_inputs, params,
                                        warmup=warmup, repeats=repeats, sync=sync, timer=timer)
    def roots_of(result: tuple[Any, Any]) -> list[torch.Tensor]:  # what a new graph's backward starts from
        got, loss = result
        return [loss] if loss_fn is not None else [t for t in got if isinstance(t, torch.Tensor) and t.requires_grad]

    peak = forward_backward_peak(forward, roots_of, grads, device)
    if device.type == "cuda":
        cuda_peak = peak
        for t in params + grad_inputs:
            t.grad = None
    split = split_backward_bytes(roots_of(forward()), grads, grad_inputs, params, device) if roots else SplitBackwardBytes()
    m = _summary(fwd, bwd, bwd_input, saved, prev_saved, tensor_bytes(y), flops, cuda_peak, peak,
                 saved.held_bytes_of([t for t in y if isinstance(t, torch.Tensor)]), saved.held_bytes_of(tensors), split)
    return m, tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in y), saved


def _time_backward(roots: Any, grads: Any, grad_inputs: list[torch.Tensor], params: list[torch.nn.Parameter], *,
                   warmup: int, repeats: int, sync: Callable[[], None], timer: str) -> tuple[list[float], float]:
    """(full backward samples, input-gradient ms) of the graph from `roots` (a tensor or a list,
    seeded with `grads`): the input-gradient part alone is timed only when there are both
    parameters and `grad_inputs` (otherwise it is all of the backward, or nothing)."""
    leaves = params + grad_inputs

    def clear() -> None:
        for t in leaves:
            t.grad = None

    clear()
    bwd = timed_ms(lambda: torch.autograd.backward(roots, grads, retain_graph=True), warmup=warmup, repeats=repeats, sync=sync, timer=timer)
    clear()
    if grad_inputs and params:
        samples = timed_ms(lambda: torch.autograd.grad(roots, grad_inputs, grads, retain_graph=True, allow_unused=True),
                           warmup=warmup, repeats=repeats, sync=sync, timer=timer)
        return bwd, min(statistics.median(samples), statistics.median(bwd))
    return bwd, statistics.median(bwd) if grad_inputs else 0.0
