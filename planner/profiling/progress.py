"""How far `pplan profile` has come, and the time it still needs, weighted by each step's cost.

Measuring a layer at micro-batch 32 costs about 32 times as much as at micro-batch 1, so a
count of steps done extrapolates far too little time: a review saw `about 48s left` for a
profile that took 12 min 49 s. Here every step left is priced from what has been measured:

- a layer at size s: that layer's time per sample at the largest size measured so far, times s
  (a layer not measured yet: the mean time per sample of those that are). Proportional to the
  size, the simplest rule that the measurements support: on the 2-core development machine it
  predicted 25.7 s left at half of a 54 s gpt profile (27.1 s were), where counting steps said
  13.5 s; a layer whose time grows faster than the size (a large vocabulary's cross-entropy)
  is still under-priced until its larger sizes are measured.
- the co-run's switch to size s (its workers finish an iteration at the new size before any
  layer is timed): the time per sample of the last switch, the first excepted (it includes the
  workers' start); before one is seen, one training iteration, priced from the layer steps.
- the optimizer step of a layer (timed once, after every size): seconds per parameter of the
  optimizer steps measured so far; before any, a per-device prior (PRIOR_S_PER_PARAM_STEP).

Progress is reported as on_step(done, total, note) in thousandths of the estimated work
(UNITS): done / total = elapsed / (elapsed + estimated time left), so a caller that
extrapolates `elapsed * (total - done) / done`, as `pplan profile`'s bar does, shows this
estimate. done is reported once per step, however far it moved; it never goes back, and it
stays below total until the last step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["UNITS", "PRIOR_S_PER_PARAM_STEP", "Step", "EtaModel", "ProfileProgress", "profile_steps", "profile_progress"]

UNITS = 1000
"""on_step's total: a thousandth of the work keeps the time left within 1% of the estimate from
a tenth of the way on, at no more than UNITS calls over a whole profile."""

PRIOR_S_PER_PARAM_STEP = {"cpu": 15e-9, "cuda": 0.05e-9}
"""Seconds per parameter of one Adam step over copies of a layer's parameters, before any has
been measured. cpu: measured, fp32 on one thread of the development machine (an 8-layer MLP's
4.2M-parameter layers took 0.25 s for 4 steps; a gpt's 8.2M-parameter embedding, 0.46 s).
cuda: not measured (no GPU here): Adam moves about 28 bytes per fp32 parameter, at about 0.6 TB/s."""

_EXTRA_OPTIMIZER_STEPS = 2
"""Adam steps per layer besides the timed ones: the one that creates its state and the one whose
allocator peak gives optimizer_workspace_bytes (planner.profiling.optstep)."""

LAYER, CO_RUN, OPTIMIZER = "layer", "co-run", "optimizer"


@dataclass(frozen=True)
class Step:
    """One unit of measuring work: a layer at a size, the co-run's switch to a size, or a layer's
    optimizer step (size 0: it does not depend on the size)."""

    kind: str
    size: int
    layer: int


def profile_steps(sizes: tuple[int, ...], n_layers: int, *, co_run: bool) -> list[Step]:
    """Every step of a profile, in the order the profiler takes them."""
    steps: list[Step] = []
    for size in sizes:
        if co_run:
            steps.append(Step(CO_RUN, size, -1))
        steps.extend(Step(LAYER, size, i) for i in range(n_layers))
    steps.extend(Step(OPTIMIZER, 0, i) for i in range(n_layers))
    return steps


class EtaModel:
    """The expected cost of the steps not done yet, from the durations of those done (seconds,
    however measured: tests give them directly). Kept as running sums, so that each step costs
    the same however many steps a profile has (4,000 layers x a few sizes is a valid profile)."""

    def __init__(self, steps: list[Step], layer_params: list[int], *, runs_per_step: int, optimizer_steps: int,
                 prior_s_per_param_step: float) -> None:
        self.pending = dict.fromkeys(steps)  # insertion-ordered: the profiler's order
        self.n_steps = len(self.pending)
        self._params = layer_params
        self._runs = max(1, runs_per_step)  # forward+backward runs a layer step makes at least
        self._prior = prior_s_per_param_step * optimizer_steps
        self._left = [0] * len(layer_params)  # per layer, the sum of the sizes still to measure
        for step in steps:
            if step.kind == LAYER:
                self._left[step.layer] += step.size
        self._unmeasured_left = sum(self._left)  # of the layers without a rate yet
        self._rate: dict[int, tuple[int, float]] = {}  # layer -> (largest size measured, s per sample)
        self._rate_sum = self._known_cost = 0.0  # sum of the rates; sum of rate x sizes left, over _rate
        self._switch_rate: float | None = None  # co-run: s per sample of the last switch
        self._switches = 0
        self._switch_left = sum(st.size for st in steps if st.kind == CO_RUN)
        self._optimizer = [0.0, 0]  # seconds, parameters of the optimizer steps measured
        self._params_left = sum(layer_params[st.layer] for st in steps if st.kind == OPTIMIZER)

    def record(self, step: Step, seconds: float) -> None:
        """`step` took `seconds`; an unknown or repeated step is ignored (it prices nothing)."""
        if step not in self.pending:
            return
        del self.pending[step]
        seconds = max(0.0, seconds)
        if step.kind == LAYER:
            self._record_layer(step.layer, step.size, seconds)
        elif step.kind == CO_RUN:
            self._switch_left -= step.size
            self._switches += 1
            if self._switches > 1:  # the first switch waits for the workers' start too
                self._switch_rate = seconds / step.size
        else:
            params = self._params[step.layer]
            self._params_left -= params
            if params > 0:
                self._optimizer[0] += seconds
                self._optimizer[1] += params

    def _record_layer(self, layer: int, size: int, seconds: float) -> None:
        self._left[layer] -= size
        known = self._rate.get(layer)
        if known is None:
            self._unmeasured_left -= size + self._left[layer]  # the layer has a rate from now on
            old = 0.0
        else:
            self._known_cost -= known[1] * size
            if size < known[0]:
                return  # a smaller size than one measured already: its rate stays
            old = known[1]
        rate = seconds / size
        self._rate[layer] = (size, rate)
        self._rate_sum += rate - old
        self._known_cost += (rate - old) * self._left[layer]

    def basis(self) -> int:
        """The largest size a layer has been measured at (0: none yet): what the estimate scales."""
        return max((size for size, _ in self._rate.values()), default=0)

    def remaining_s(self) -> float | None:
        """Expected seconds of the steps left; None before any layer has been measured."""
        if not self._rate:
            return None if self.pending else 0.0
        mean = self._rate_sum / len(self._rate)  # a layer not measured yet
        layers = self._known_cost + mean * self._unmeasured_left
        # a co-run switch before one is seen: an iteration, a layer step being at least _runs passes
        iteration = (self._rate_sum + mean * (len(self._params) - len(self._rate))) / self._runs
        switches = (self._switch_rate if self._switch_rate is not None else iteration) * self._switch_left
        optimizer = (self._optimizer[0] / self._optimizer[1] if self._optimizer[1] else self._prior) * self._params_left
        return max(0.0, layers + switches + optimizer)  # running sums: no rounding below 0


class ProfileProgress:
    """Times each step with `clock`, feeds the EtaModel, and reports on_step(done, UNITS, note)."""

    def __init__(self, model: EtaModel, on_step: Callable[[int, int, str], None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model, self._on_step, self._clock = model, on_step, clock
        self._started = self._last = clock()
        self._shown = 0

    def start(self) -> None:
        """Announce the work (done 0), so that a progress bar starts its clock with this one."""
        self._started = self._last = self._clock()
        if self._on_step is not None:
            self._on_step(0, UNITS, "")

    def measuring(self) -> None:
        """Steps start now: what came before (building the model, its warm-up) is no step's cost."""
        self._last = self._clock()

    def done(self, step: Step, what: str) -> None:
        """`step` has just finished; `what` names it for the note."""
        now = self._clock()
        self.model.record(step, now - self._last)
        self._last = now
        self._report(now - self._started, what)

    def units_done(self, elapsed_s: float) -> int | None:
        """Thousandths of the work done after `elapsed_s`: elapsed / (elapsed + time left); None
        while nothing can be estimated. Below UNITS until every step is done."""
        if not self.model.pending:
            return UNITS
        left = self.model.remaining_s()
        if left is None:
            return None
        total = elapsed_s + left
        fraction = elapsed_s / total if total > 0 else 0.0
        return min(UNITS - 1, math.floor(fraction * UNITS))

    def _report(self, elapsed_s: float, what: str) -> None:
        units, report = self.units_done(elapsed_s), self._on_step
        if report is None or units is None or units <= self._shown:
            return  # an estimate revised upwards holds the bar until the work catches up
        m = self.model
        basis = m.basis()
        note = f"{what} ({m.n_steps - len(m.pending)}/{m.n_steps} steps; time left estimated " \
               f"from micro-batch {basis} per sample)" if m.pending else what
        report(units, UNITS, note)  # once per step, however far it moved (a caller's bar takes jumps)
        self._shown = units


def profile_progress(sizes: tuple[int, ...], layer_params: list[int], *, co_run: bool, device: str, warmup: int,
                     repeats: int, on_step: Callable[[int, int, str], None] | None,
                     clock: Callable[[], float] = time.monotonic) -> ProfileProgress:
    """The progress of measuring layers with `layer_params` parameters each at `sizes`, as
    planner.profiling.profiler takes its steps (`device`: cpu, cuda or cuda:N)."""
    model = EtaModel(profile_steps(sizes, len(layer_params), co_run=co_run), layer_params,
                     runs_per_step=warmup + repeats, optimizer_steps=max(warmup, 1) + repeats + _EXTRA_OPTIMIZER_STEPS,
                     prior_s_per_param_step=PRIOR_S_PER_PARAM_STEP[device.partition(":")[0]])
    return ProfileProgress(model, on_step, clock)
