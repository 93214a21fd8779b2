"""Compute time of a stage: profiled layer times, device speed and the calibration.

Time of one micro-batch on a stage (device speed s divides every compute time):
  F = sum fwd_ms over the stage's layers
  B = sum bwd_ms + sum fwd_ms over recomputed layers (the recompute runs just before backward)
  I = sum bwd_input_ms + recompute forward;  W = sum bwd_weight_ms   (split backward, I+W = B)
  optimizer step = sum optimizer_ms, once per iteration

The calibration (planner.calibration) scales every compute time by compute_scale and adds
action_overhead_ms to every F/B/I/W action (`action_ms`); the optimizer step is scaled only
(`scaled_ms`).

The partitioner's objective is a per-micro-batch proxy of a stage (`stage_time_ms`):
  t = (sum (fwd+bwd) x scale + sum recomputed fwd x scale) / speed
      + overhead x actions per micro-batch + send of the input gradient + send of the output
written once here; the DP calls it over arrays, brute force over numbers, the ILP over PuLP
expressions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.calibration import Calibration
from planner.profiling.profile import LayerCosts

__all__ = [
    "compute_terms",
    "action_ms",
    "scaled_ms",
    "actions_per_microbatch",
    "microbatch_overhead_ms",
    "layer_compute_ms",
    "stage_time_ms",
]


def compute_terms(calibration: Calibration | None) -> tuple[float, float]:
    """(compute scale, overhead per action in ms); identity without a calibration."""
    if calibration is None:
        return 1.0, 0.0
    return calibration.compute_scale, calibration.action_overhead_ms


def action_ms(ms: float, calibration: Calibration | None) -> float:
    """Calibrated duration of one F/B/I/W action whose profiled time (at the device's speed) is `ms`."""
    scale, overhead = compute_terms(calibration)
    return ms * scale + overhead


def scaled_ms(ms: float, calibration: Calibration | None) -> float:
    """Calibrated compute that is not a whole pipeline action (the optimizer step, the recompute
    part of a backward): scaled, without the per-action overhead."""
    return ms * compute_terms(calibration)[0]


def actions_per_microbatch(split_backward: bool) -> int:
    """Compute actions a stage runs per micro-batch: F and B, or F, I and W."""
    return 3 if split_backward else 2


def microbatch_overhead_ms(calibration: Calibration | None, split_backward: bool) -> float:
    """The calibration's per-action overhead summed over one micro-batch's actions on a stage."""
    return compute_terms(calibration)[1] * actions_per_microbatch(split_backward)


def layer_compute_ms(costs: LayerCosts, calibration: Calibration | None) -> tuple[np.ndarray, np.ndarray]:
    """Per layer at speed 1, calibrated: (forward + backward, extra when recomputed = forward again)."""
    scale = compute_terms(calibration)[0]
    fwd = np.asarray(costs.fwd_ms, dtype=float)
    return (fwd + np.asarray(costs.bwd_ms, dtype=float)) * scale, fwd * scale


def stage_time_ms(compute_ms: Any, recompute_ms: Any, speed: Any, overhead_ms: Any,
                  send_in_ms: Any = 0.0, send_out_ms: Any = 0.0) -> Any:
    """The partitioner's time of one micro-batch on a stage (module docstring).

    `compute_ms` and `recompute_ms` are sums of layer_compute_ms over the stage and its
    recomputed layers; the sends are planner.cost.comm.transfer_ms at each boundary (0 at the
    pipeline's ends). Pure arithmetic: numbers, numpy arrays and PuLP expressions all work.
    """
    return (compute_ms + recompute_ms) / speed + overhead_ms + send_in_ms + send_out_ms
