"""Pricing one data x pipeline x tensor candidate: the pipeline DP on one GPU's layer costs (the
profile's costs transformed by planner.cost.parallel), a bound for branch and bound, and the
simulation that judges it (planner.partition.parallel_search drives the search; which points a
layout can run at all: planner.partition.parallel_checks)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from planner.cost.memory import MemoryBreakdown
from planner.cost.parallel import (
    ModelFlops, Placement, collective_ms, exposed_sync_ms, grad_sync_ms, profile_precision, tensor_parallel_costs,
    tp_layers,
)
from planner.cost.replica_bytes import gradient_bytes, least_stage_static_bytes, static_bytes
from planner.hardware import Hardware
from planner.parallel import ParallelConfig, run_refusal
from planner.partition.build import Layout, build_problem
from planner.plan import PredictedDevice
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.memory_floor import fits_no_cut, schedule_snapshots
from planner.profiling.profile import LayerCosts, Profile
from planner.schedules import generate, generate_order, get_schedule
from planner.schedules.interleaved import rounds
from planner.schedules.memory import Moment, corner_moments, stage_memory_moments, undominated, with_more_microbatches
from planner.simulation.replica import Cluster, ReplicaCosts, replica_costs, replica_layout, simulate_replica

__all__ = ["ParallelCandidate", "ParallelTask", "ParallelCosts", "inflight_peaks", "memory_moments", "layer_static_bytes",
           "least_static_bytes", "helping_zero", "least_memory", "solve_task", "simulate_task"]

@dataclass(frozen=True)
class ParallelCandidate:
    """One simulated (D, P, T, b, schedule, recompute) plan."""

    config: ParallelConfig
    """dp, pp, tp and ZeRO stage."""
    schedule: str
    """Pipeline schedule."""
    micro_batch_size: int
    """Samples per micro-batch (b)."""
    n_microbatches: int
    """Micro-batches per replica per iteration (M = B / (D b))."""
    recompute: str
    """none or full (every layer's activations recomputed)."""
    cuts: tuple[int, ...]
    """Stage boundaries (P*v + 1 layer indices)."""
    iteration_ms: float
    """Simulated iteration time, gradient sync and optimizer step included, ms."""
    samples_per_s: float
    """Global batch / iteration time."""
    tokens_per_s: float
    """samples/s x sequence length."""
    peak_memory_bytes: float
    """Largest per-GPU peak: ZeRO static state + activations + buffers."""
    memory: MemoryBreakdown
    """That GPU's breakdown: weights, gradients, optimizer, activations, buffers (bytes)."""
    tflops_per_gpu: float
    """Achieved model TFLOP/s per GPU (recompute's FLOPs counted when recomputing, as Narayanan et al.)."""
    mfu: float
    """Forward + backward model FLOPs / (iteration time x GPUs x peak)."""
    bubble_fraction: float
    """Simulated idle share of the pipeline."""
    grad_sync_ms: float
    """Largest stage's data-parallel gradient sync (before overlap), ms."""
    tp_comm_ms: float
    """Tensor-parallel all-reduce time per micro-batch on the busiest stage (forward + backward), ms."""
    fits: bool
    """Peak memory within the GPU's memory."""
    devices: tuple[PredictedDevice, ...] = ()
    """Per pipeline rank (a tensor-parallel group): one GPU's busy and idle time and its peak memory
    by kind against the limit, as the simulation predicts them (the plan's `predicted.devices`)."""

    @property
    def schedule_label(self) -> str:
        """The schedule, with its chunks per rank when more than one: `interleaved/v3`."""
        chunks = (len(self.cuts) - 1) // self.config.pp
        return self.schedule if chunks == 1 else f"{self.schedule}/v{chunks}"


@dataclass(frozen=True)
class ParallelTask:
    """One (layout, b, M, schedule, recompute) point to solve, with its balanced-stage estimate."""

    cfg: ParallelConfig
    """dp, pp, tp and ZeRO stage."""
    b: int
    """Micro-batch size."""
    m: int
    """Micro-batches per replica."""
    schedule: str
    """Pipeline schedule."""
    v: int
    """Stages per pipeline rank."""
    recompute: str
    """none or full."""
    estimate_ms: float
    """Lower bound of the iteration time (balanced stages)."""


class ParallelCosts:
    """Shared state: the profile's costs per (b, layout), the cluster and the model's
    training precision. `vocab_parallel`: price tensor parallelism as Megatron runs it, embedding
    and head split over T too (planner.cost.parallel.tp_shards), rather than as `pplan run` does."""

    def __init__(self, profile: Profile, hw: Hardware, gpn: int, zero: int, compute_scale: float = 1.0, overlap: bool = False,
                 vocab_parallel: bool = False):
        self.profile, self.zero, self.vocab_parallel = profile, zero, vocab_parallel
        self.cluster = Cluster(hw, gpn, compute_scale, overlap)
        self._raw: dict[int, LayerCosts] = {}
        self._per_gpu: dict[tuple, ReplicaCosts] = {}
        self.bounds: dict[tuple, float] = {}  # planner.partition.branch_bound.cut_estimate's, per layout and point shape
        self.precision = profile_precision(profile)

    @property
    def gpn(self) -> int:
        """GPUs per node."""
        return self.cluster.gpus_per_node

    @property
    def overlap(self) -> bool:
        """The gradient sync may overlap each stage's last backward."""
        return self.cluster.overlap_grad_sync

    def place(self, cfg: ParallelConfig) -> Placement:
        """The links `cfg` uses on this cluster."""
        return self.cluster.placement(cfg)

    def raw(self, b: int) -> LayerCosts:
        if b not in self._raw:
            self._raw[b] = self.profile.at(b)
        return self._raw[b]

    def replica(self, cfg: ParallelConfig, b: int) -> ReplicaCosts:
        """One GPU's costs under `cfg` at micro-batch size b (cached: layouts share them)."""
        # what the costs depend on: T, D only through ZeRO (its sharded optimizer step, ZeRO-3's
        # gathers), and which links they use
        key = (b, cfg.tp, cfg.dp if self.zero >= 1 else 0, cfg.dp * cfg.pp * cfg.tp <= self.gpn)
        if key not in self._per_gpu:
            make = _vocab_parallel_costs if self.vocab_parallel else replica_costs
            self._per_gpu[key] = make(self.raw(b), self.profile.names, replace(cfg, zero=self.zero), self.cluster)
        return self._per_gpu[key]

    def costs(self, cfg: ParallelConfig, b: int) -> LayerCosts:
        return self.replica(cfg, b).layers


def _vocab_parallel_costs(raw: LayerCosts, names: tuple[str, ...], cfg: ParallelConfig, cluster: Cluster) -> ReplicaCosts:
    """replica_costs with every layer split over T, as Megatron splits the vocabulary (embedding, head)."""
    place, blocks = cluster.placement(cfg), tp_layers(names)
    return ReplicaCosts(
        layers=tensor_parallel_costs(raw, blocks, cfg.tp, place.tp, cfg.dp, cfg.zero, place.dp, cluster.compute_scale,
                                     vocab_parallel=True, memory_bytes_per_s=cluster.memory_bound_bytes_per_s),
        tp_comm_ms=collective_ms(raw, blocks, cfg.tp, place.tp),
        collectives_ms=collective_ms(raw, blocks, cfg.tp, place.tp, cfg.dp, cfg.zero, place.dp, vocab_parallel=True),
    )


def least_static_bytes(ctx: ParallelCosts, cfg: ParallelConfig) -> float:
    """A lower bound of the static bytes (weights, gradients, optimizer with cfg's ZeRO) of the
    busiest GPU of `cfg`, from the same per-GPU layer costs the pipeline DP holds (blocks / T, the
    embedding and head whole on every tp rank): the search skips a layout this alone rules out."""
    costs = ctx.costs(cfg, min(ctx.profile.micro_batch_sizes))  # weights do not depend on the micro-batch size
    return least_stage_static_bytes(layer_static_bytes(ctx, costs, cfg), cfg.pp)


def helping_zero(ctx: ParallelCosts, layouts: list[ParallelConfig], mem: float) -> int | None:
    """The ZeRO stage to suggest when nothing fits: the first above the searched one (ZeRO-2 holds
    more than ZeRO-1 at a pipeline's peak, zero_shares, so from 1 or 2 it is 3) that shrinks some
    layout `pplan run` executes (dp > 1: one replica has nothing to shard) to static bytes within
    `mem`; None when no stage would."""
    zero = layouts[0].zero if layouts else ctx.zero
    for stage in ((1, 3) if zero == 0 else (3,) if zero < 3 else ()):
        for cfg in layouts:
            sharded = replace(cfg, zero=stage)
            if cfg.dp > 1 and (ctx.vocab_parallel or run_refusal(sharded) is None) and least_static_bytes(ctx, sharded) <= mem:
                return stage
    return None


def _layout(cfg: ParallelConfig, v: int, mem: float, ctx: ParallelCosts) -> Layout:
    devices, links = replica_layout(cfg, mem, ctx.cluster)
    return Layout(devices=devices, order=tuple(range(cfg.pp)), links=links, virtual_stages=v)


def layer_static_bytes(ctx: ParallelCosts, costs: LayerCosts, cfg: ParallelConfig) -> np.ndarray:
    """Per layer, one GPU's weights, gradients and optimizer state under `cfg` (its tp share of
    `costs`, ZeRO's shares over dp): what the pipeline DP holds static and the search's bound sums."""
    return static_bytes(costs.param_bytes, cfg.dp, cfg.zero, ctx.precision)


@functools.lru_cache(maxsize=256)
def _moments_cached(name: str, p: int, m: int, v: int) -> tuple[tuple[Moment, ...], ...]:
    return tuple(stage_memory_moments(generate_order(name, p, m, v)))


@functools.lru_cache(maxsize=256)
def memory_moments(name: str, p: int, m: int, v: int) -> tuple[tuple[Moment, ...], ...]:
    """Per stage, planner.schedules.memory.stage_memory_moments of the schedule, what the DP prices a
    stage's memory at (the simulator's own peaks), cheap whatever M is: the schedule at M' =
    min(M, 2 x per round) (3 x for a held-sends schedule: at two rounds its first backward is not
    yet covered by later ones), where it rounds micro-batches as M does, has the same shape, and M - M' more
    micro-batches only add to what grows with them: a held-sends schedule's ended I (sent_grads, once
    any has ended), and GPipe's micro-batches in flight. Exact for every valid (schedule, P <= 8, v,
    M <= 10P), tested in tests/test_parallel_moments.py."""
    small = _moments_size(name, p, m)
    base = _moments_cached(name, p, small, v)
    extra = m - small
    if not extra:
        return base
    grows = get_schedule(name).holds_every_microbatch
    return tuple(undominated([with_more_microbatches(x, extra, grows) for x in stage]) for stage in base)


@functools.lru_cache(maxsize=256)
def inflight_peaks(name: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """Per stage: micro-batches in flight at peak, the most of its memory_moments (GPipe: all M; the
    others saturate after two rounds of torch's micro-batches); exact for every valid (schedule,
    P <= 8, v, M <= 10P), tested in tests/test_parallel_moments.py."""
    return tuple(max(x.in_flight for x in stage) for stage in memory_moments(name, p, m, v))


@functools.lru_cache(maxsize=256)
def _corners(name: str, p: int, m: int, v: int) -> tuple[tuple[Moment, ...], ...]:
    """memory_moments, each stage's reduced to its corner_moments once per schedule: the search's DPs
    price no recompute choice (none or full), and so would reduce them again for every task."""
    return tuple(corner_moments(stage) for stage in memory_moments(name, p, m, v))


def _problem(ctx: ParallelCosts, task: ParallelTask, mem: float, with_moments: bool = True):
    """The pipeline DP's instance of `task` with `mem` bytes per GPU; without its memory moments
    (one micro-batch in flight), what planner.partition.memory_floor reads: costs and budgets."""
    cfg = task.cfg
    costs = ctx.costs(cfg, task.b)
    key = (task.schedule, cfg.pp, task.m, task.v)
    prob = build_problem(costs, _layout(cfg, task.v, mem, ctx), inflight_peaks(*key) if with_moments else [1] * (cfg.pp * task.v),
                         optimizer="adam", recompute="all" if task.recompute == "full" else "none",
                         split_backward=get_schedule(task.schedule).split_backward, n_microbatches=task.m,
                         moments=_corners(*key) if with_moments else None)
    return replace(prob, static_bytes=layer_static_bytes(ctx, costs, cfg))


def _moments_size(name: str, p: int, m: int) -> int:
    """M' of memory_moments: the micro-batch count whose schedule gives the moments at M = `m`."""
    per_round = rounds(p, m)[1]
    small = min(m, (3 if get_schedule(name).holds_sends else 2) * per_round)
    return m if rounds(p, small)[1] != per_round else small  # the shorter schedule rounds its micro-batches otherwise


def least_memory(ctx: ParallelCosts, task: ParallelTask) -> float:
    """The least memory per GPU under which the pipeline DP fits some cut of `task` (bytes; inf when
    none does): the simulated peak of that plan for one chunk per rank, at least it for interleaved."""
    got = min_memory_scale(_problem(ctx, task, 1.0))
    return got[0] if got else math.inf


def solve_task(ctx: ParallelCosts, task: ParallelTask, mem: float, gpn: int, floor: bool = False):
    """(bottleneck estimate, task, solution) or, when nothing fits, the least memory scale that would (float).
    With `floor`, None when planner.partition.memory_floor proves that nothing fits first (the
    least scale unknown: solve again without `floor` to learn it)."""
    cfg = task.cfg
    if floor and fits_no_cut(_problem(ctx, task, mem, with_moments=False),
                             schedule_snapshots(task.schedule, cfg.pp, task.m, _moments_size(task.schedule, cfg.pp, task.m), task.v)):
        return None
    prob = _problem(ctx, task, mem)
    # Most of a search's tasks fit no cut (254 of the 305 for GPT-175B on 1,536 A100s), and the DP
    # learns that only after raising its time cap pass by pass. The memory-only min-max DP says so
    # for a fraction of the work, and exactly: a cut that fits has every stage's least bytes within
    # its budget (the same moments and terms as the DP, planner.partition.dp), so a least scale
    # above 1 leaves the DP nothing. (Holds for recompute none and all, the only ones here.)
    least = min_memory_scale(prob)
    if least is None or least[0] > 1.0:
        return least[0] * mem if least else math.inf
    sol = solve_dp(prob)
    if sol is None:
        return least[0] * mem
    return (_dp_estimate(ctx, task, ctx.costs(task.cfg, task.b), sol), task, sol)


def _dp_estimate(ctx: ParallelCosts, task: ParallelTask, costs: LayerCosts, sol) -> float:
    """(M + bubble) x the busiest rank's time per micro-batch (the sum of its stages' times: with
    v stages per rank, v x the slowest stage over-prices a rank whose stages are unequal), + the
    largest per-rank exposed gradient sync and optimizer step. Each stage's sync hides behind its
    own backward (recompute included) only, as the simulator overlaps it (planner.cost.parallel.
    rank_exposed_sync_ms). Never below the task's balanced estimate (every term is at least its
    average over the ranks)."""
    cfg = task.cfg
    place = ctx.place(cfg)
    cuts = sol.cuts
    params, opt, bwd, fwd = (np.concatenate([[0.0], np.cumsum(np.asarray(col, dtype=float))])
                             for col in (costs.param_bytes, costs.optimizer_ms, costs.bwd_ms, costs.fwd_ms))
    work = [0.0] * cfg.pp
    tail = [0.0] * cfg.pp
    for s in range(len(cuts) - 1):
        first, end, r = cuts[s], cuts[s + 1], s % cfg.pp
        sync = grad_sync_ms(float(gradient_bytes(params[end] - params[first], ctx.precision)), cfg.dp, ctx.zero, place.dp)
        backward = bwd[end] - bwd[first] + sum(fwd[i + 1] - fwd[i] for i in sol.recompute[s])
        tail[r] += exposed_sync_ms(sync, backward, ctx.overlap) + opt[end] - opt[first]
        work[r] += sol.stage_ms[s]
    return (task.m + get_schedule(task.schedule).bubble_slots(cfg.pp, task.v)) * max(work) + max(tail)


def simulate_task(ctx: ParallelCosts, task: ParallelTask, sol, mem: float, flops: ModelFlops) -> ParallelCandidate:
    """Simulate the DP's solution of `task` (planner.simulation.replica): per-GPU memory with
    ZeRO, TFLOP/s and MFU from `flops`."""
    cfg = task.cfg
    layout = _layout(cfg, task.v, mem, ctx)
    sim = simulate_replica(generate(task.schedule, cfg.pp, task.m, task.v), ctx.replica(cfg, task.b), sol.cuts,
                           sol.recompute, cfg, ctx.cluster, flops, devices=layout.devices, links=layout.links,
                           stage_device=[layout.device_of(s) for s in range(len(sol.cuts) - 1)], micro_batch_size=task.b)
    rep = sim.replica
    worst = max(range(sim.n_devices), key=lambda d: (sim.peak_memory_bytes[d], -d))
    peak = float(sim.peak_memory_bytes[worst])
    return ParallelCandidate(
        config=cfg, schedule=task.schedule, micro_batch_size=task.b, n_microbatches=task.m, recompute=task.recompute,
        cuts=tuple(int(c) for c in sol.cuts), iteration_ms=sim.iteration_ms, samples_per_s=sim.throughput_samples_per_s,
        tokens_per_s=rep.tokens_per_s, peak_memory_bytes=peak, memory=sim.memory[worst],
        tflops_per_gpu=rep.tflops_per_gpu, mfu=rep.mfu, bubble_fraction=sim.bubble_fraction,
        grad_sync_ms=rep.grad_sync_ms, tp_comm_ms=rep.tp_comm_ms, fits=peak <= mem,
        devices=sim.prediction().devices or (),
    )
