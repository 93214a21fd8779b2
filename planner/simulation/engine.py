"""The discrete-event simulator over the schedule IR (the fast core, `simulate_costs`).

Model (docs/simulator.md):
- Each device runs its rank's actions one at a time, in the schedule's order, each as soon as
  the device is free and its input has arrived: F of stage s needs F of s-1's output, B/I of s
  needs B/I of s+1's gradient (the last stage: its own F), W needs its own I.
- A stage boundary between two devices is a transfer of latency + bytes / bandwidth
  (planner.cost.comm.transfer_parts). The latency runs on the directed link sender -> receiver
  from the sender's end (sends are asynchronous: the sender carries on; each directed link
  carries one transfer at a time, first-in first-out). The bytes move once the receiver has
  posted its receive, which torch's schedules do just before the consuming action: that part
  runs on the receiver, at the start of the consuming action (a C row on the receiver; not busy
  time). A receiver already waiting gets the data latency + bytes / bandwidth after the
  sender's end, as before; one busy when it was sent pays the bytes' part when it gets there.
- Recomputed layers cost their forward again just before the backward (folded into B/I by
  planner.cost; the timeline shows that part as an R row).
- Data parallelism: a stage's gradient synchronisation (StageCost.grad_sync_ms) starts inside
  its last backward action (a W when the backward is split), which hides up to that action's
  length of it (overlap_grad_sync; without
  overlap it all runs after); the exposed rest delays the optimizer step. Tensor-parallel
  collectives are part of each F/B/I (StageCost.comm_*_ms), drawn as a T row at the box's end.
- Each device ends the iteration with its optimizer step after its last backward work and
  its exposed gradient sync; iteration time = max over devices of that end
  (+ calibration.step_overhead_ms).
- Calibration: compute times pass through planner.cost.action_ms (scale, plus the per-action
  overhead); the optimizer step is scaled only (cost.scaled_ms); a transfer costs
  cost.link_ms, where comm_latency_ms / comm_bandwidth_bytes_per_s replace every link's values,
  and a cross-rank hand-over costs the sending and the receiving action cost.handover_cpu_ms
  each (0 unless the machine measured it).
Every duration and byte count comes from planner.cost; this module only orders them in time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from planner.calibration import Calibration
from planner.cost import StageCost, action_ms, link_between, scaled_ms, stage_memory
from planner.cost.comm import handover_cpu_ms, transfer_parts
from planner.cost.memory import MemoryBreakdown
from planner.cost.parallel import rank_exposed_sync_ms
from planner.errors import PlanError, ScheduleError
from planner.plan import Device, Links
from planner.schedules.actions import KINDS, PipelineSchedule
from planner.schedules.compiled import CODE_B, CODE_F, CODE_I, CODE_W, CompiledSchedule, SweepResult, compile_schedule, sweep
from planner.schedules.memory import memory_peaks
from planner.schedules.memory_states import warmup_send_rows
from planner.schedules.registry import get_schedule, holds_sends, holds_warmup_send
from planner.simulation.result import SimResult, TimelineRow

__all__ = ["simulate_costs"]

_IDENTITY = Calibration()


def simulate_costs(
    schedule: PipelineSchedule,
    stages: Sequence[StageCost],
    stage_device: Sequence[int],
    devices: Sequence[Device],
    links: Links,
    *,
    micro_batch_size: int,
    calibration: Calibration | None = None,
    record_timeline: bool = False,
    interpolated: bool = False,
    overlap_grad_sync: bool = True,
    memory_model: Callable[[Sequence[StageCost], float], MemoryBreakdown] | None = None,
) -> SimResult:
    """Simulate one iteration of `schedule` with per-stage costs (already divided by device speed).

    `stage_device[s]` is the device index (into `devices`) of stage s; all stages of one rank
    must share a device and different ranks need different devices. ScheduleError on deadlock.
    `memory_model(stages, peak activation bytes)` prices a device's memory (default: one
    pipeline's, planner.cost.stage_memory; a data-parallel replica passes
    planner.cost.parallel.replica_memory for ZeRO's sharding).
    """
    cs = compile_schedule(schedule)
    cal = calibration or _IDENTITY
    M = cs.n_microbatches
    rank_device = _rank_devices(cs, stages, stage_device, devices)
    compute, recv, send_ms, link, n_links = _tables(cs, stages, stage_device, links, cal,
                                                    _charges_handover(schedule.name))
    # a consuming action starts with receiving its input's bytes (module docstring)
    res = sweep(cs, [c + r for c, r in zip(compute, recv)], send_ms, link, n_links, order=schedule.order)

    n_dev = len(devices)
    sync = _grad_syncs(cs, stages, rank_device, n_dev, overlap_grad_sync)
    opt_start, opt_end, busy = _device_ends(cs, res, stages, rank_device, n_dev, compute, sync, cal)
    iteration = float(max(opt_end) + cal.step_overhead_ms)
    price = memory_model or (lambda sts, peak: stage_memory(list(sts), peak))
    memory, gradients = _device_memory(schedule, cs, stages, rank_device, n_dev, price)
    timeline: tuple[TimelineRow, ...] = ()
    mem_timeline: dict[int, tuple[tuple[float, float], ...]] = {}
    if record_timeline:
        timeline = _timeline_rows(cs, res, stages, recv, cal, rank_device, opt_start, opt_end, sync)
        mem_timeline = _memory_timeline(cs, res, stages, rank_device, memory, gradients, opt_start, opt_end,
                                        holds_sends(schedule.name, cs.split_backward), holds_warmup_send(schedule.name))
    return _sim_result(schedule.name, M, micro_batch_size, interpolated, devices, iteration, busy, memory,
                       timeline, mem_timeline)


def _sim_result(name: str, M: int, micro_batch_size: int, interpolated: bool, devices: Sequence[Device],
                iteration: float, busy: Sequence[float], memory: Sequence[MemoryBreakdown],
                timeline: tuple[TimelineRow, ...], mem_timeline: dict[int, tuple[tuple[float, float], ...]]) -> SimResult:
    """The SimResult of one simulated iteration: its totals derived from per-device busy time and memory."""
    total_busy = sum(busy)
    return SimResult(
        iteration_ms=iteration,
        # clamp: summing busy times action by action can exceed the sweep's total by an ulp
        bubble_fraction=max(0.0, 1.0 - total_busy / (len(devices) * iteration)) if iteration > 0 else 0.0,
        throughput_samples_per_s=(M * micro_batch_size * 1e3 / iteration) if iteration > 0 else float("inf"),
        schedule=name,
        n_microbatches=M,
        micro_batch_size=micro_batch_size,
        interpolated=interpolated,
        device_names=tuple(dv.name for dv in devices),
        busy_ms=tuple(busy),
        idle_ms=tuple(iteration - b for b in busy),
        peak_memory_bytes=tuple(m.total for m in memory),
        memory=tuple(memory),
        memory_limit_bytes=tuple(dv.memory_bytes for dv in devices),
        timeline=timeline,
        memory_timeline=mem_timeline,
    )


def _device_ends(cs: CompiledSchedule, res: SweepResult, stages: Sequence[StageCost], rank_device: list[int], n_dev: int,
                 dur: list[float], sync: list[tuple[float, float]], cal: Calibration) -> tuple[list[float], list[float], list[float]]:
    """Per device: optimizer step start and end (after its last backward and its exposed
    gradient sync) and busy time."""
    opt_start = [0.0] * n_dev
    opt_end = [0.0] * n_dev
    busy = [0.0] * n_dev
    for r, d in enumerate(rank_device):
        opt = scaled_ms(sum(stages[s].optimizer_ms for s in cs.rank_stages[r]), cal)
        opt_start[d] = res.device_end[r] + sync[d][1]
        opt_end[d] = opt_start[d] + opt
        # an exposed gradient sync counts as busy: it is not a pipeline bubble
        busy[d] = float(opt + sync[d][1] + sum(n * dur[k] for k, n in cs.rank_keys[r]))
    return opt_start, opt_end, busy


def _device_memory(schedule: PipelineSchedule, cs: CompiledSchedule, stages: Sequence[StageCost], rank_device: list[int],
                   n_dev: int, price: Callable[[Sequence[StageCost], float], MemoryBreakdown],
                   ) -> tuple[list[MemoryBreakdown], list[float]]:
    """Per device: peak memory of its stages, the larger of two moments: when activations and the
    gradients that exist by then peak together (planner.schedules.memory.memory_peaks: gradients
    from a stage's first weight-gradient action; GPipe's activation peak holds none), and the
    optimizer step (every gradient, no activations, the step's temporaries; `price` charges those
    as the activations figure when they are larger). Also each device's gradient bytes when all
    exist (for the memory timeline)."""
    peaks = memory_peaks(schedule, [st.kept_bytes for st in stages], [st.transient_bytes for st in stages],
                         [st.param_bytes for st in stages], [st.held_output_bytes for st in stages],
                         [st.wgrad_bytes for st in stages], [st.sent for st in stages],
                         [st.running_i_bytes for st in stages], [st.w_workspace_bytes for st in stages],
                         [st.output_bytes for st in stages])
    memory = [price([], 0.0)] * n_dev
    gradients = [0.0] * n_dev
    for r, d in enumerate(rank_device):
        mine = [stages[s] for s in cs.rank_stages[r]]
        act, grads = peaks[r]
        params = sum(st.param_bytes for st in mine)
        during = price(mine, act)
        during = replace(during, gradients=during.gradients * (grads / params if params > 0 else 1.0))
        step = price(mine, 0.0)
        memory[d] = during if during.total >= step.total else step
        gradients[d] = step.gradients
    return memory, gradients


def _rank_devices(cs: CompiledSchedule, stages: Sequence[StageCost], stage_device: Sequence[int],
                  devices: Sequence[Device]) -> list[int]:
    S = cs.n_stages
    if len(stages) != S or len(stage_device) != S:
        raise PlanError(f"schedule has {S} stages but {len(stages)} stage costs and {len(stage_device)} stage devices were given")
    rank_device = [-1] * cs.n_ranks
    for s in range(S):
        d, r = stage_device[s], cs.stage_rank[s]
        if not 0 <= d < len(devices):
            raise PlanError(f"stage {s} is on device {d}, outside the {len(devices)} devices")
        if rank_device[r] not in (-1, d):
            raise PlanError(f"stages of schedule rank {r} are on devices {rank_device[r]} and {d}", "a rank's stages must share one device")
        rank_device[r] = d
    used = [d for d in rank_device if d >= 0]
    if len(set(used)) != len(used):
        raise PlanError(f"ranks map to devices {rank_device}: two ranks share a device", "give each rank its own device")
    return rank_device


def _charges_handover(name: str) -> bool:
    """Whether the schedule's torch runtime computes while its sends move (registry
    `sends_overlap_compute`); a schedule the registry does not know is taken to."""
    try:
        return get_schedule(name).sends_overlap_compute
    except ScheduleError:
        return True


def _tables(cs: CompiledSchedule, stages: Sequence[StageCost], stage_device: Sequence[int], links: Links,
            cal: Calibration, handover: bool = True) -> tuple[list[float], list[float], list[float], list[int], int]:
    """Per key (kind * S + stage): compute ms, ms receiving its input's bytes at its start, the
    link part (latency) of its output's transfer, and the directed link that crosses (-1: none).
    `handover`: charge each cross-rank transfer's CPU share (cost.handover_cpu_ms) to both ends."""
    S = cs.n_stages
    dur = [0.0] * cs.n_keys
    recv = [0.0] * cs.n_keys
    send = [0.0] * cs.n_keys
    link = [-1] * cs.n_keys
    link_ids: dict[tuple[int, int], int] = {}
    for s, st in enumerate(stages):
        for code, ms in ((CODE_F, st.fwd_ms), (CODE_B, st.bwd_ms), (CODE_I, st.bwd_input_ms), (CODE_W, st.bwd_weight_ms)):
            dur[code * S + s] = action_ms(ms, cal)
        # F sends its output to stage s+1; B/I send the input gradient (same size) to stage s-1,
        # where the action of the same kind consumes it
        for code, dst, nbytes in ((CODE_F, s + 1, st.output_bytes), (CODE_B, s - 1, st.input_bytes), (CODE_I, s - 1, st.input_bytes)):
            if not 0 <= dst < S or nbytes <= 0:
                continue
            a, b = stage_device[s], stage_device[dst]
            if a == b:
                continue
            key = code * S + s
            send[key], recv[code * S + dst] = transfer_parts(nbytes, link_between(links, a, b), cal)
            link[key] = link_ids.setdefault((a, b), len(link_ids))
            # both ranks lose the hand-over's CPU share (0 unless the machine measured one)
            cpu = handover_cpu_ms(nbytes, cal) if handover else 0.0
            dur[key] += cpu
            recv[code * S + dst] += cpu
    return dur, recv, send, link, len(link_ids)


def _grad_syncs(cs: CompiledSchedule, stages: Sequence[StageCost], rank_device: list[int], n_dev: int,
                overlap: bool) -> list[tuple[float, float]]:
    """Device -> (hidden, exposed) ms of its stages' data-parallel gradient sync."""
    out = [(0.0, 0.0)] * n_dev
    for r, d in enumerate(rank_device):
        mine = [stages[s] for s in cs.rank_stages[r]]
        exposed = rank_exposed_sync_ms(mine, overlap, cs.split_backward)
        out[d] = (sum(st.grad_sync_ms for st in mine) - exposed, exposed)
    return out


def _comm_tail_ms(st: StageCost, kind: int) -> float:
    """The collective part of an F, B or I box (drawn at the box's end)."""
    if kind == CODE_F:
        return st.comm_fwd_ms
    return st.comm_bwd_ms if kind in (CODE_B, CODE_I) else 0.0


def _timeline_rows(cs: CompiledSchedule, res: SweepResult, stages: Sequence[StageCost], recv: Sequence[float],
                   cal: Calibration, rank_device: list[int], opt_start: list[float], opt_end: list[float],
                   sync: list[tuple[float, float]]) -> tuple[TimelineRow, ...]:
    rows: list[TimelineRow] = []
    for r in range(cs.n_ranks):
        d = rank_device[r]
        for a in cs.ids[r]:
            kind, s, m = cs.split_id(a)
            t0, t1 = res.start[a], res.end[a]
            got = recv[a // cs.n_microbatches]
            if got > 0:  # receiving the input's bytes, on the receiver (not busy time)
                rows.append(TimelineRow(d, s, "C", m, t0, t0 + got))
                t0 += got
            # the recompute part of B/I: its scaled forward (the action's overhead stays in B/I)
            rec = scaled_ms(stages[s].recompute_ms, cal) if kind in (CODE_B, CODE_I) else 0.0
            if rec > 0:
                rows.append(TimelineRow(d, s, "R", m, t0, t0 + rec))
                t0 += rec
            comm = min(_comm_tail_ms(stages[s], kind), t1 - t0)
            rows.append(TimelineRow(d, s, KINDS[kind], m, t0, t1 - comm))
            if comm > 0:
                rows.append(TimelineRow(d, s, "T", m, t1 - comm, t1))
            if res.send_start[a] >= 0:
                rows.append(TimelineRow(d, s, "C", m, res.send_start[a], res.ready[a]))
        hidden, exposed = sync[d]
        if hidden + exposed > 0:
            rows.append(TimelineRow(d, -1, "A", -1, res.device_end[r] - hidden, res.device_end[r] + exposed))
        rows.append(TimelineRow(d, -1, "O", -1, opt_start[d], opt_end[d]))
    rows.sort(key=lambda x: (x.start_ms, x.device, x.kind == "C", x.stage))
    return tuple(rows)


def _memory_timeline(cs: CompiledSchedule, res: SweepResult, stages: Sequence[StageCost], rank_device: list[int],
                     memory: list, gradients: list[float], opt_start: list[float],
                     opt_end: list[float], sends_held: bool, warmup_send: bool = False,
                     ) -> dict[int, tuple[tuple[float, float], ...]]:
    """Device -> (time, total bytes) after each change, replaying the rank's order of events:
    activations with F and their backward, a stage's gradients from the end of its first
    weight-gradient action (B, or W when split; the start of a split W on a stage but the first)
    until the optimizer step frees them, the stage
    output torch holds freed at the end of I when split (on the last stage the loss's tensors with it),
    what W starts from held from the end of I to the end of W (StageCost.wgrad_bytes; while I runs,
    the transient and StageCost.running_i_bytes), the transient during B or I (W on the first stage;
    StageCost.w_workspace_bytes during W on the others), what
    sends hold until they are waited for, before the optimizer step, where the runtime holds them
    (`sends_held`, registry holds_sends; StageCost.sent: each input gradient from the end of its I,
    the held output from the end of I, the whole output from the end of W; both from the end of B),
    the output 1F1B's warm-up send holds after its backward (`warmup_send`, registry
    holds_warmup_send: _warm_send_changes), and the optimizer step's temporaries."""
    out: dict[int, tuple[tuple[float, float], ...]] = {}
    for r in range(cs.n_ranks):
        d = rank_device[r]
        mine = [stages[s] for s in cs.rank_stages[r]]
        params = sum(st.param_bytes for st in mine)
        # the device's whole gradient bytes as priced (ZeRO may shard them), shared by parameter bytes
        grad_per_byte = gradients[d] / params if params > 0 else 0.0
        step = max((st.optimizer_workspace_bytes for st in mine), default=0.0)
        level = memory[d].weights + memory[d].optimizer + memory[d].buffers
        points = [(0.0, level)]
        has_grads: set[int] = set()
        sent = 0.0  # what sends hold until the step's sends are waited for
        warm = _warm_send_changes(cs, r, stages) if warmup_send else {}

        def change(t: float, delta: float) -> None:
            nonlocal level
            if delta:
                level += delta
                points.append((t, level))

        for a in cs.ids[r]:
            kind, s, _ = cs.split_id(a)
            st = stages[s]
            making = 0.0
            if kind == CODE_W and s > 0 and s not in has_grads:  # a split W makes every gradient before it frees anything
                has_grads.add(s)
                making = grad_per_byte * st.param_bytes
            at_start, at_end, held = _action_memory(kind, s, st, sends_held, making)
            change(res.start[a], at_start)
            change(res.end[a], at_end + warm.get(a, 0.0))
            sent += held
            if kind in (CODE_B, CODE_W) and s not in has_grads:
                has_grads.add(s)
                change(res.end[a], grad_per_byte * st.param_bytes)
        change(opt_start[d], step - sent)  # the sends are waited for; the step's temporaries, then its end frees the gradients
        change(opt_end[d], -step - grad_per_byte * sum(stages[s].param_bytes for s in has_grads))
        out[d] = tuple(points)
    return out


def _warm_send_changes(cs: CompiledSchedule, r: int, stages: Sequence[StageCost]) -> dict[int, float]:
    """Action id -> bytes rank r's warm-up send adds at that action's end (memory_states.warmup_send_rows):
    its stage's output at the end of the backward after which only the send holds it, taken off
    at the end of the last action during which it is held."""
    ids = list(cs.ids[r])
    if not ids:
        return {}
    codes = [cs.split_id(a) for a in ids]
    local = {s: i for i, s in enumerate(cs.rank_stages[r])}
    rows = warmup_send_rows(np.array([k for k, _, _ in codes]), np.array([m for _, _, m in codes]),
                            np.array([local[s] for _, s, _ in codes]), len(local))
    out: dict[int, float] = {}
    for k in range(len(ids)):
        for c, s in enumerate(cs.rank_stages[r]):
            if rows[k, c] and k > 0 and not rows[k - 1, c]:  # held from the end of the action before
                out[ids[k - 1]] = out.get(ids[k - 1], 0.0) + stages[s].output_bytes
            if rows[k, c] and (k + 1 == len(ids) or not rows[k + 1, c]):  # released when this action ends
                out[ids[k]] = out.get(ids[k], 0.0) - stages[s].output_bytes
    return out


def _action_memory(kind: int, s: int, st: StageCost, sends_held: bool, making: float) -> tuple[float, float, float]:
    """(bytes an action of stage `s` adds when it starts, when it ends, and what its sends hold until
    the step waits for them) as _memory_timeline replays it; `making`: the gradients a split W makes
    before it frees anything (0 but for the stage's first W on a stage past the first)."""
    if kind == CODE_F:
        return st.kept_bytes, 0.0, 0.0
    if kind == CODE_B:
        held = st.sent_grad_bytes + st.sent_output_bytes if sends_held else 0.0
        return st.transient_bytes, -st.transient_bytes - st.kept_bytes + held, held
    if kind == CODE_I:  # it stores wgrads as it runs (running_i_bytes); the first stage's I computes nothing
        trans = st.transient_bytes if s > 0 else 0.0
        return (trans + st.running_i_bytes,
                -trans - st.running_i_bytes + st.wgrad_bytes - st.held_output_bytes + st.sent_grad_bytes + st.sent_held_bytes,
                st.sent_grad_bytes + st.sent_held_bytes)
    # W frees what its I left (the first stage's whole backward runs now, its transient; on the others
    # the fresh weight gradients, w_workspace_bytes); the output's send holds all of it
    trans = st.transient_bytes if s == 0 else st.w_workspace_bytes
    return (trans + making,
            -trans - (st.kept_bytes - st.held_output_bytes) - st.wgrad_bytes + st.sent_output_bytes - st.sent_held_bytes,
            st.sent_output_bytes - st.sent_held_bytes)
