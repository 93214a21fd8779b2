"""The run JSON and the measured timeline, from what the ranks recorded, next to the prediction.

Definitions (docs/executor.md):
  iteration_ms_measured  median step time over the measured steps (after --warmup); a step's time
                         is the slowest rank's, barrier exit to the end of its optimizer step
  error_pct              100 x (predicted - measured) / measured
  busy_ms                a rank's F/B/I/W/R/O time in the timeline step (the measured step whose
                         time is closest to the median), as the simulator's busy_ms
  peak_memory_bytes_measured  CUDA: the allocator's peak; CPU: weights + gradients + optimizer
                         state (from the tensors) + peak saved activations (saved-tensor hooks) +
                         boundary buffers (2 x (input + output) bytes of one micro-batch)
  losses                 mean loss of each step in loss_steps; JSON has no inf/NaN, so a loss
                         that is not finite is written as null
  diverged               null, or {"step": k, "loss": "inf" | "-inf" | "nan"}: the first step
                         (0-based) whose loss was not finite; the run stopped after it
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from planner.plan import Plan
from planner.simulation.result import TimelineRow

__all__ = ["FORMAT", "assemble_run", "measured_timeline", "error_pct", "transfer_gaps"]

FORMAT = "pplan-run/1"


def error_pct(predicted: float | None, measured: float) -> float | None:
    """100 x (predicted - measured) / measured, or None without a prediction."""
    if predicted is None or measured <= 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _aligned_offsets(records: list[dict[str, Any]]) -> list[float]:
    """Per rank, ms to add to its event times so all ranks share one origin.

    On one machine perf_counter is one monotonic clock for all processes, so the ranks' step
    starts can be compared; across machines each rank keeps its own start (barrier exit).
    """
    if len({r["host"] for r in records}) != 1:
        return [0.0] * len(records)
    origin = min(r["chosen_t0"] for r in records)
    return [(r["chosen_t0"] - origin) * 1e3 for r in records]


def measured_timeline(records: list[dict[str, Any]]) -> list[TimelineRow]:
    """Timeline rows of the timeline step, in the simulator's layout (O rows have stage -1)."""
    rows = []
    for rec, off in zip(records, _aligned_offsets(records)):
        for stage, kind, mb, start, end in rec["events"]:
            rows.append(TimelineRow(rec["device"], -1 if kind == "O" else stage, kind, mb, start + off, end + off))
    rows.sort(key=lambda r: (r.start_ms, r.device, r.stage))
    return rows


def transfer_gaps(rows: list[TimelineRow], n_stages: int, boundary_bytes: dict[str, list[int]]) -> list[list[float]]:
    """[bytes, ms] for every cross-device hand-over where the receiver sat waiting for it.

    A hand-over is F(s-1, m) -> F(s, m) or B/I(s+1, m) -> B/I(s, m) on different devices. When
    the receiver was idle before it (its previous action ended before the sender's), the time
    from the sender's end to the receiver's start is what one transfer really costs in the
    pipeline (send, receive and waking the waiting process): calibration fits the link latency
    to it. Needs one clock for all ranks (a single machine).
    """
    begin: dict[tuple[int, str, int], tuple[float, float, int]] = {}  # action -> (start, prev end, device)
    end_of: dict[tuple[int, str, int], tuple[float, int]] = {}
    by_dev: dict[int, list[TimelineRow]] = {}
    for r in rows:
        if r.kind in ("F", "B", "I", "W", "R", "O"):
            by_dev.setdefault(r.device, []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: (r.start_ms, r.kind != "R"))
        prev_end, pending = float("-inf"), None  # pending: an R row waiting for its B/I
        for r in rs:
            group = "F" if r.kind == "F" else "BI"
            if r.kind == "R":
                pending = (r.start_ms, prev_end)
            elif r.kind in ("F", "B", "I"):
                start, before = pending if pending and r.kind != "F" else (r.start_ms, prev_end)
                begin[(r.stage, group, r.microbatch)] = (start, before, dev)
                end_of[(r.stage, group, r.microbatch)] = (r.end_ms, dev)
                pending = None
            prev_end = r.end_ms
    out = []
    for (s, group, m), (start, before, dev) in begin.items():
        if group == "F":
            src, nbytes = (s - 1, "F", m), (boundary_bytes.get(str(s)) or [0, 0])[0]
        else:
            src, nbytes = (s + 1, "BI", m), (boundary_bytes.get(str(s)) or [0, 0])[1]
        if not 0 <= src[0] < n_stages or src not in end_of:
            continue
        sent, sender = end_of[src]
        if sender != dev and sent >= before:
            out.append([float(nbytes), start - sent])
    return out


def _busy(rec: dict[str, Any]) -> float:
    return sum(end - start for _, kind, _, start, end in rec["events"] if kind in ("F", "B", "I", "W", "R", "O"))


def assemble_run(records: list[dict[str, Any]], plan: Plan, *, plan_path: str | None, device_type: str,
                 steps: int, warmup: int, prediction: dict[str, Any] | None, prediction_source: str | None,
                 calibration: dict[str, Any] | None) -> dict[str, Any]:
    """The run JSON (docs/HELPERS.md layout plus details) from rank records and a prediction."""
    records = sorted(records, key=lambda r: r["rank"])
    r0 = records[0]
    step_ms = r0["step_ms"]
    measured = r0["measured_steps"]
    meas = statistics.median(step_ms[i] for i in measured) if measured else float("nan")
    pred = prediction.get("iteration_ms") if prediction else None
    losses: dict[str, float] = {}
    for rec in records:
        losses.update(rec["losses"])
    loss_steps = sorted(int(k) for k in losses)
    bad = [k for k in loss_steps if not math.isfinite(losses[str(k)])]
    stops = [rec.get("diverged_step") for rec in records if rec.get("diverged_step") is not None]
    diverged = None
    if bad or stops:
        step = bad[0] if bad else min(stops)
        value = losses.get(str(step))
        diverged = {"step": step, "loss": "unknown" if value is None else str(value)}
    boundary = {k: v for rec in records for k, v in rec.get("boundary_bytes", {}).items()}
    pred_devices = {d["device"]: d for d in prediction.get("devices", [])} if prediction else {}
    ranks = []
    for rec in records:
        pd = pred_devices.get(rec["device"], {})
        mem = rec.get("memory") or {}
        ranks.append({
            "rank": rec["rank"],
            "device": rec["device"],
            "host": rec["host"],
            "stages": rec["stages"],
            "busy_ms": _busy(rec),
            "busy_ms_predicted": pd.get("busy_ms"),
            "peak_memory_bytes_measured": mem.get("peak_bytes"),
            "peak_memory_bytes_predicted": pd.get("peak_memory_bytes"),
            "memory_limit_bytes": plan.devices[rec["device"]].memory_bytes,
            "memory_measure": mem.get("measure"),
            "memory_measured": mem.get("breakdown"),
            "memory_predicted": pd.get("memory"),
            "rss_peak_bytes": mem.get("rss_peak_bytes"),
            "action_ms": rec["action_ms"],
            "threads": rec["threads"],
        })
    return {
        "format": FORMAT,
        "plan": plan_path,
        "model": plan.model,
        "schedule": plan.schedule,
        "runtime": r0["runtime"],
        "device_type": device_type,
        "n_ranks": plan.n_devices,
        "n_stages": plan.n_stages,
        "micro_batch_size": plan.micro_batch_size,
        "n_microbatches": plan.n_microbatches,
        "optimizer": plan.optimizer,
        "steps": steps,
        "first_step": r0["first_step"],
        "warmup": warmup,
        "iteration_ms_measured": meas,
        "iteration_ms_predicted": pred,
        "error_pct": error_pct(pred, meas),
        "prediction_source": prediction_source,
        "calibration": calibration,
        "losses": [losses[str(k)] for k in loss_steps],
        "loss_steps": loss_steps,
        "diverged": diverged,
        "step_ms": step_ms,
        "measured_steps": measured,
        "timeline_step": r0["chosen_step"],
        "ranks": ranks,
        "comm": [c for rec in records for c in rec.get("comm", [])],
        "boundary_bytes": boundary,
        "transfer_gaps": transfer_gaps(measured_timeline(records), plan.n_stages, boundary)
        if len({rec["host"] for rec in records}) == 1 else [],
    }
