"""What `pplan partition` shows people (text tables) and machines (a JSON summary)."""

from __future__ import annotations

from typing import Any

from planner.cost.held import wgrad_unmeasured_note
from planner.partition.api import PartitionResult, baseline_rows, runners_up
from planner.plan import SearchRecord
from planner.schedules import SCHEDULE_NAMES, get_schedule
from planner.units import format_bytes, format_ms

__all__ = ["summary_dict", "summary_text"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w if h else "" for h, w in zip(header, widths)])] + [line(r) for r in rows]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summary_dict(result: PartitionResult) -> dict[str, Any]:
    """Per-stage and per-device numbers, the bottleneck, runners-up and baselines."""
    plan, chosen, prof = result.plan, result.chosen, result.profile
    sim = chosen.sim
    if not (sim is not None and chosen.stages is not None):  # cannot happen for any input: the search always fills these
        raise RuntimeError("internal error: sim is not None and chosen.stages is not None")
    stages = []
    for s, st in enumerate(chosen.stages):
        a, b = st.layers
        stages.append({
            "stage": s, "device": st.device, "device_name": plan.devices[st.device].name,
            "layers": [a, b], "first_name": prof.names[a], "last_name": prof.names[b - 1],
            "recompute": list(st.recompute), "time_ms": chosen.stage_ms[s], "memory_bytes": int(chosen.stage_bytes[s]),
        })
    devices = [
        {"device": d, "name": plan.devices[d].name, "peak_memory_bytes": int(sim.peak_memory_bytes[d]),
         "memory_limit_bytes": plan.devices[d].memory_bytes, "memory": sim.memory[d].as_dict(), "busy_ms": sim.busy_ms[d]}
        for d in range(plan.n_devices)
    ]
    search = plan.search or SearchRecord()
    return {
        "iteration_ms": sim.iteration_ms,
        "bubble_fraction": sim.bubble_fraction,
        "throughput_samples_per_s": sim.throughput_samples_per_s,
        "bottleneck_stage": search.bottleneck_stage or 0,
        "stages": stages,
        "devices": devices,
        "runners_up": [r.to_dict() for r in search.candidates or ()],
        "baselines": [r.to_dict() for r in search.baselines or ()],
    }


def _memory_unpriced(result: PartitionResult, c: Any) -> bool:
    """Whether candidate `c`'s memory leaves out what the profile does not measure (cost.held's
    rule: a split backward or sends held, without wgrad_bytes): its 'fits' is then a lower bound."""
    spec = get_schedule(c.point.schedule)
    return wgrad_unmeasured_note(result.profile.at(c.point.micro_batch_size), spec.split_backward, spec.holds_sends) is not None


def _why(result: PartitionResult) -> list[str]:
    chosen = result.chosen
    rows = []
    unsure = False
    for c in runners_up(result.search, chosen):
        guess = c.fits and _memory_unpriced(result, c)
        unsure |= guess
        mark = "<- plan" if c is chosen else ""
        rows.append([
            c.point.schedule, str(c.point.n_microbatches), str(c.point.micro_batch_size), c.method,
            format_ms(c.iteration_ms) if c.sim else "-",
            _pct(c.sim.bubble_fraction) if c.sim else "-",
            format_ms(c.bottleneck_ms) if c.stage_ms else "-",
            _pct(c.peak_over_limit) if c.sim and c.peak_over_limit > 0 else "-",
            ("yes?" if guess else "yes") if c.fits else "NO", mark,
        ])
    lines = [f"why {chosen.point.schedule} x {chosen.point.n_microbatches}: best (schedule, M) by simulated iteration time"]
    lines += _table(["schedule", "M", "b", "method", "iteration", "bubble", "bottleneck/mb", "peak/limit", "fits", ""], rows)
    # the pool's cuts, as in the table above (every method's with --method auto, that one's with
    # another): a note that read only the plan's own method once said zb M=2 cost 33% more while the
    # table listed it (uniform cuts) at 20%; one that read every method under --method uniform
    # named DP cuts the plan could not take, at "-21.2% more"
    others = [c for c in result.search.candidates if c.origin in result.search.pool]
    smaller = [c for c in others if c.fits and c.point.n_microbatches > chosen.point.n_microbatches]
    larger = [c for c in others if c.fits and c.point.n_microbatches < chosen.point.n_microbatches]
    notes = ["yes?: fits if what the profile does not measure (no wgrad_bytes column) is small; see the warning"] if unsure else []
    if smaller:
        c = min(smaller, key=lambda c: c.iteration_ms)
        notes.append(f"more, smaller micro-batches (best {c.point.schedule} M={c.point.n_microbatches}) cost {_pct(c.iteration_ms / chosen.iteration_ms - 1)} more: per-micro-batch inefficiency outweighs the smaller bubble")
    if larger:
        c = min(larger, key=lambda c: c.iteration_ms)
        notes.append(f"fewer, larger micro-batches (best {c.point.schedule} M={c.point.n_microbatches}) cost {_pct(c.iteration_ms / chosen.iteration_ms - 1)} more: a larger bubble")
    fitting = {(c.point.schedule, c.point.n_microbatches) for c in others if c.fits}
    unfit_points = sorted({(SCHEDULE_NAMES.index(c.point.schedule), c.point.n_microbatches) for c in others
                           if (c.point.schedule, c.point.n_microbatches) not in fitting})
    unfit = [f"{SCHEDULE_NAMES[k]} M={m}" for k, m in unfit_points]
    if unfit:
        notes.append(f"{len(unfit)} (schedule, M) do not fit memory: {', '.join(unfit[:6])}{' ...' if len(unfit) > 6 else ''}")
    return lines + [f"  {n}" for n in notes]


def _baselines(result: PartitionResult) -> list[str]:
    rows = []
    for r in baseline_rows(result.search, result.chosen):
        at = r.at_plan_setting
        setting = f"{r.schedule} M={r.n_microbatches}"
        if r.fits:
            verdict = f"{r.slowdown_vs_plan:.2f}x" if r.slowdown_vs_plan else "-"
            rows.append([r.method, setting, format_ms(r.iteration_ms), verdict, "yes",
                         "OOM" if at and not at.fits else (format_ms(at.iteration_ms) if at and at.iteration_ms else "-")])
        else:
            rows.append([r.method, setting, "-", "-", "NO (OOM)", (r.note or "")[:60]])
    lines = ["baselines (same schedules, M and recompute policy; simulated)"]
    return lines + _table(["method", "best setting", "iteration", "plan is faster by", "fits", "at plan's setting"], rows)


def summary_text(result: PartitionResult) -> str:
    """The human report: headline, stage table, device memory, why, baselines."""
    plan, chosen, prof = result.plan, result.chosen, result.profile
    sim = chosen.sim
    if not (sim is not None and chosen.stages is not None):  # cannot happen for any input: the search always fills these
        raise RuntimeError("internal error: sim is not None and chosen.stages is not None")
    search = plan.search or SearchRecord()
    limit = {d.memory_bytes for d in plan.devices}
    lim_text = ("unlimited memory" if limit == {None} else
                format_bytes(next(iter(limit))) if len(limit) == 1 else "per-device memory limits")
    proof = "" if search.optimal is None else (" (optimal)" if search.optimal else " (time limit: best found)")
    lines = [
        f"profile {prof.path or '<memory>'}: {prof.n_layers} layers; {plan.n_devices} devices x {lim_text}; global batch {plan.global_batch}"
        + ("; calibrated" if search.calibrated else ""),
        f"plan: {plan.schedule}, {plan.n_microbatches} micro-batches of {plan.micro_batch_size}, recompute {search.recompute}, "
        f"cuts by {chosen.origin}{proof}" + (f", then {chosen.polished} cut move(s) by the simulator-driven polish" if chosen.polished else ""),
        f"predicted: {format_ms(sim.iteration_ms)} per iteration, bubble {_pct(sim.bubble_fraction)}, "
        f"{sim.throughput_samples_per_s:.1f} samples/s" + (f" ({prof.size_note(plan.micro_batch_size)})" if sim.interpolated else ""),
        "",
    ]
    rows = []
    for s, st in enumerate(chosen.stages):
        a, b = st.layers
        names = prof.names[a] if b - a == 1 else f"{prof.names[a]} .. {prof.names[b - 1]}"
        dev = plan.devices[st.device]
        rows.append([str(s), dev.name, f"[{a}, {b})", names[:36], str(len(st.recompute)), format_ms(chosen.stage_ms[s]),
                     format_bytes(chosen.stage_bytes[s])])
    lines += _table(["stage", "device", "layers", "names", "recompute", "time/mb", "memory"], rows)
    b = search.bottleneck_stage or 0
    lines.append(f"bottleneck: stage {b} ({format_ms(chosen.stage_ms[b])} per micro-batch: fwd+bwd, recompute and sends)")
    lines.append("")
    drows = []
    for d, dev in enumerate(plan.devices):
        m = sim.memory[d]
        lim = dev.memory_bytes
        drows.append([dev.name, format_bytes(m.total), "-" if lim is None else format_bytes(lim), "-" if not lim else _pct(m.total / lim),
                      format_bytes(m.weights + m.gradients + m.optimizer), format_bytes(m.activations), format_bytes(m.buffers)])
    lines += _table(["device", "peak", "limit", "use", "weights+grads+opt", "activations", "buffers"], drows)
    lines.append("")
    lines += _why(result)
    lines.append("")
    lines += _baselines(result)
    if search.skipped:
        lines.append("")
        lines.append(f"not searched: {len(search.skipped)} (schedule, M) that torch cannot run, e.g. {search.skipped[0]}")
    return "\n".join(lines)

