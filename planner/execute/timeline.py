"""The measured timeline, rebuilt from the ranks' measurements in the simulator's layout, and the
hand-overs in it where a receiver waited (what calibration fits the link latency to).
"""

from __future__ import annotations

from planner.execute.measurement import RankMeasurement
from planner.simulation.result import TimelineRow

__all__ = ["replica0", "measured_timeline", "transfer_gaps", "one_clock"]


def replica0(measurements: list[RankMeasurement]) -> list[RankMeasurement]:
    """The measurements of data-parallel replica 0 and tensor-parallel rank 0 (all of them without
    either): the pipeline whose timeline and actions are compared with the simulator's one
    pipeline (the other tp ranks of a stage run the same actions at the same times)."""
    return [m for m in measurements if m.replica == 0 and m.tp == 0]


def one_clock(measurements: list[RankMeasurement]) -> bool:
    """Whether the ranks ran on one host: perf_counter is then one monotonic clock for all of
    them, so their step starts can be compared."""
    return len({m.host for m in measurements}) == 1


def _aligned_offsets(measurements: list[RankMeasurement]) -> list[float]:
    """Per rank, ms to add to its event times so all ranks share one origin (on one host; across
    hosts each rank keeps its own start, the barrier exit)."""
    if not one_clock(measurements):
        return [0.0] * len(measurements)
    origin = min(m.timeline_t0 for m in measurements)
    return [(m.timeline_t0 - origin) * 1e3 for m in measurements]


def measured_timeline(measurements: list[RankMeasurement]) -> list[TimelineRow]:
    """Timeline rows of the timeline step, in the simulator's layout (O rows have stage -1)."""
    rows = []
    for m, off in zip(measurements, _aligned_offsets(measurements)):
        for e in m.events:
            rows.append(TimelineRow(m.device, -1 if e.kind == "O" else e.stage, e.kind, e.microbatch,
                                    e.start_ms + off, e.end_ms + off))
    rows.sort(key=lambda r: (r.start_ms, r.device, r.stage))
    return rows


_SAME_INSTANT_MS = 1e-6
"""Times within this are one instant: each rank's times are shifted to one origin in float ms, so a
receiver that started as the message arrived can read a few 1e-13 ms before the sender's end."""


def transfer_gaps(rows: list[TimelineRow], n_stages: int, boundary_bytes: dict[str, list[int]]) -> list[list[float]]:
    """[bytes, ms] for every cross-device hand-over where the receiver sat waiting for it.

    A hand-over is F(s-1, m) -> F(s, m) or B/I(s+1, m) -> B/I(s, m) on different devices. The
    receiver waited for it when it was idle as the message was sent (its previous action ended
    no later than the sender's) and started after it: the time from the sender's end to the
    receiver's start is then what one transfer really costs in the pipeline (send, receive and
    waking the waiting process), so every gap is at least 0 (a start before the send, beyond the
    rounding of _SAME_INSTANT_MS, is no wait and gives no gap); calibration fits the link latency
    to it. Needs one clock for all ranks (a single machine).
    """
    begin, end_of = _action_spans(rows)
    out = []
    for (s, group, m), (start, before, dev) in begin.items():
        if group == "F":
            src, nbytes = (s - 1, "F", m), (boundary_bytes.get(str(s)) or [0, 0])[0]
        else:
            src, nbytes = (s + 1, "BI", m), (boundary_bytes.get(str(s)) or [0, 0])[1]
        if not 0 <= src[0] < n_stages or src not in end_of:
            continue
        sent, sender = end_of[src]
        if sender != dev and before <= sent <= start + _SAME_INSTANT_MS:
            out.append([float(nbytes), max(0.0, start - sent)])
    return out


_Key = tuple[int, str, int]  # (stage, "F" or "BI", micro-batch)


def _action_spans(rows: list[TimelineRow]) -> tuple[dict[_Key, tuple[float, float, int]], dict[_Key, tuple[float, int]]]:
    """Per F and B/I action: (start, end of the device's action before it, device), and (end, device).

    A backward that recomputes is measured as an R row followed by its B, I or W row of the same
    stage and micro-batch: the action starts where its R starts. An R belongs only to the row
    right after it: the R of a W (zero bubble recomputes for the weight gradient too) is not the
    start of the device's next I, which may come much later.
    """
    begin: dict[_Key, tuple[float, float, int]] = {}
    end_of: dict[_Key, tuple[float, int]] = {}
    by_dev: dict[int, list[TimelineRow]] = {}
    for r in rows:
        if r.kind in ("F", "B", "I", "W", "R", "O"):
            by_dev.setdefault(r.device, []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: (r.start_ms, r.kind != "R"))
        prev_end, pending = float("-inf"), None  # pending: an R row and the end before it
        for r in rs:
            start, before = r.start_ms, prev_end
            if pending and r.kind in ("B", "I", "W") and (pending[0].stage, pending[0].microbatch) == (r.stage, r.microbatch):
                start, before = pending[0].start_ms, pending[1]
            pending = (r, prev_end) if r.kind == "R" else None
            if r.kind in ("F", "B", "I"):
                key = (r.stage, "F" if r.kind == "F" else "BI", r.microbatch)
                begin[key] = (start, before, dev)
                end_of[key] = (r.end_ms, dev)
            prev_end = r.end_ms
    return begin, end_of
