"""The registry of schedule families: everything pplan knows about a schedule, by name.

As torch's `get_schedule_class(name)` maps a name to its class, `get_schedule(name)` maps it
to a ScheduleSpec: the generator of its per-rank order, the torch class that runs it and how,
and what it supports (split backward, chunks per rank, micro-batch counts, recompute). Size checks, the partitioner's grid, the executor and the benchmarks read these
fields instead of testing names, so adding a schedule is one generator and one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from planner.errors import ScheduleError
from planner.schedules.actions import Action
from planner.schedules.gpipe import gpipe_order
from planner.schedules.interleaved import interleaved_order, rounds
from planner.schedules.onefoneb import one_f_one_b_order
from planner.schedules.zero_bubble import zb_h1_order

__all__ = ["MicrobatchRule", "TorchRuntime", "ScheduleSpec", "SCHEDULES", "SCHEDULE_NAMES", "get_schedule", "holds_sends", "holds_warmup_send", "schedule_name"]

Order = dict[int, list[Action]]
MicrobatchRule = Literal["any", "at-least-ranks", "multiple-of-rounds"]
TorchRuntime = Literal["class", "class-if-same-order", "csv"]


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule family: how to generate it, how torch runs it, and what it supports."""

    name: str
    """The name plans and the command line use."""
    order: Callable[[int, int, int], Order]
    """(ranks P, micro-batches M, chunks per rank v) -> rank -> compute actions (no idle slots)."""
    torch_class: str
    """The torch.distributed.pipelining class whose order the generator reproduces."""
    torch_runtime: TorchRuntime
    """How the executor runs it: `class` (the class's own code runs this order), `class-if-same-order`
    (the class, after its pipeline_order is checked equal to the plan's), `csv` (torch's
    _PipelineScheduleRuntime loads the plan's actions)."""
    virtual_stages: int
    """Chunks (stages) per rank the partitioner plans with."""
    multi_chunk: bool
    """True when it needs >= 2 chunks per rank (stage s on rank s mod P); False: exactly 1."""
    split_backward: bool
    """True when the backward is split into I and W (zero-bubble)."""
    microbatches: MicrobatchRule
    """torch's rule on M: any; at-least-ranks (M >= P); multiple-of-rounds (M a multiple of max(1, M // P))."""
    recompute: bool
    """True when recomputed layers (activation checkpointing) run under it."""
    description: str
    """One line for help texts and docs."""
    chunk_choices: tuple[int, ...] = ()
    """Chunks per rank the cluster search (planner.partition.parallel_search) tries; empty: just virtual_stages."""
    bubble_slots: Callable[[int, int], float] = lambda p, v: float(p - 1)
    """(ranks P, chunks per rank v) -> idle micro-batch slots per rank in the closed form (GPipe and
    1F1B: P - 1); the cluster search's estimate before it simulates (planner.partition.parallel_eval)."""
    holds_every_microbatch: bool = False
    """True when a stage holds every micro-batch's activations at its peak (all forwards before any
    backward); False when the count in flight stops growing once M >= 2P."""
    holds_sends: bool = False
    """True when torch's runtime keeps every posted send's tensors alive until the step ends:
    _PipelineScheduleRuntime (behind ScheduleInterleaved1F1B and the CSV runtime of zb) appends each
    send's Work to one list and waits for, and drops, them only after its last action, and gloo's
    SendWork keeps its tensor; so each input gradient and output sent stays alive after the backward
    that freed it (planner.schedules.memory counts them). Schedule1F1B waits for each send before the
    next and holds one at most (`holds_warmup_send`). ScheduleGPipe keeps its sends' Works to the end of its
    step too, but what it sends in its backward is held only after its peak (its first backward,
    every micro-batch in flight); measured without the sends (CPU, gloo, 2-rank gpt, 8 micro-batches)
    its peaks were -172 B and +1.7% off, so False keeps its prediction as it was."""
    holds_warmup_send: bool = False
    """True when torch's class keeps the last forward send its warm-up fired alive through its
    steady phase: Schedule1F1B's warm-up rebinds `send_work` after each forward but the last, and
    its one-backward-one-forward loop never does, so that Work (and gloo's or NCCL's reference to
    the sent output) lives until the loop ends. A stage with w >= 2 warm-up forwards thus holds the
    output of its micro-batch w - 2 from the end of its backward to the end of the first backward
    after its last forward (planner.schedules.memory's Moment.warmup_send). Measured (resnet, 2 CPU
    ranks, 4 micro-batches of 32, torch 2.13): rank 0 held that 2 MiB output during its second and
    third backward, its peak 2.1 MiB (4.8%) over the prediction without it."""
    sends_overlap_compute: bool = True
    """True when torch's runtime posts a send and computes on while the bytes move (GPipe's class,
    the runtime behind interleaved and zb); False when it waits for each send, with the next
    receive, before computing (the 1F1B class): its hand-overs then cost the ranks no compute
    (planner.cost.handover_cpu_ms is charged only where True)."""

    @property
    def chunk_counts(self) -> tuple[int, ...]:
        """The chunks per rank a search may plan with."""
        return self.chunk_choices or (self.virtual_stages,)

    def valid_microbatches(self, n_ranks: int, n_microbatches: int) -> bool:
        """True when torch's class accepts this micro-batch count on `n_ranks` ranks."""
        if self.microbatches == "at-least-ranks":
            return n_microbatches >= n_ranks
        if self.microbatches == "multiple-of-rounds":
            n_rounds, _ = rounds(n_ranks, n_microbatches)
            return n_microbatches % n_rounds == 0
        return True


def _one_chunk(fn: Callable[[int, int], Order]) -> Callable[[int, int, int], Order]:
    """A generator with one stage per rank, in the registry's (P, M, v) signature."""
    def order(n_ranks: int, n_microbatches: int, virtual_stages: int) -> Order:
        return fn(n_ranks, n_microbatches)

    order.__name__ = fn.__name__
    return order


SCHEDULES: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec(
        name="gpipe", order=_one_chunk(gpipe_order), torch_class="ScheduleGPipe", torch_runtime="class",
        virtual_stages=1, multi_chunk=False, split_backward=False, microbatches="any",
        recompute=True, description="GPipe: every forward, then every backward", holds_every_microbatch=True),
    ScheduleSpec(
        name="1f1b", order=_one_chunk(one_f_one_b_order), torch_class="Schedule1F1B", torch_runtime="class",
        virtual_stages=1, multi_chunk=False, split_backward=False, microbatches="at-least-ranks",
        recompute=True, description="1F1B (PipeDream-Flush): warm-up forwards, then one backward per forward",
        holds_warmup_send=True, sends_overlap_compute=False),
    ScheduleSpec(
        name="interleaved", order=interleaved_order, torch_class="ScheduleInterleaved1F1B",
        torch_runtime="class-if-same-order", virtual_stages=2, multi_chunk=True, split_backward=False,
        microbatches="multiple-of-rounds", recompute=True, holds_sends=True,
        description="interleaved 1F1B (Megatron-LM): several stages per rank",
        # 3 and 4 fit layer counts that 2 x P does not divide well (105 blocks on 35 ranks)
        chunk_choices=(2, 3, 4), bubble_slots=lambda p, v: (p - 1) / v),
    ScheduleSpec(
        name="zb", order=_one_chunk(zb_h1_order), torch_class="ScheduleInterleavedZeroBubble", torch_runtime="csv",
        virtual_stages=1, multi_chunk=False, split_backward=True, microbatches="multiple-of-rounds",
        recompute=True, holds_sends=True, description="ZB-H1 zero bubble: 1F1B with the backward split into I and W",
        # ZB-H1 with t_F = t_B = t_W: a third of 1F1B's bubble (Qi et al., 2024)
        bubble_slots=lambda p, v: (p - 1) / 3.0),
)}
# The order matters: it breaks ties between equally fast plans (planner.partition.search).
SCHEDULE_NAMES: tuple[str, ...] = tuple(SCHEDULES)


def get_schedule(name: str) -> ScheduleSpec:
    """The spec of schedule `name`; ScheduleError naming the known ones otherwise."""
    try:
        return SCHEDULES[name]
    except (KeyError, TypeError):
        raise ScheduleError(f"unknown schedule {name!r}", f"use one of {', '.join(SCHEDULE_NAMES)}") from None


def holds_sends(name: str, split_backward: bool) -> bool:
    """Whether a schedule called `name` keeps its sends' tensors until the step ends (ScheduleSpec.
    holds_sends). A name the registry does not know (an order read from CSV, which torch's
    _PipelineScheduleRuntime runs) is taken to hold them where its backward is split, as pplan
    priced such orders before the registry said which runtimes hold them."""
    spec = SCHEDULES.get(name) if isinstance(name, str) else None
    return split_backward if spec is None else spec.holds_sends


def holds_warmup_send(name: str) -> bool:
    """Whether a schedule called `name` keeps its warm-up's last forward send through its steady
    phase (ScheduleSpec.holds_warmup_send); False for a name the registry does not know (an order
    read from CSV runs on torch's _PipelineScheduleRuntime, which holds_sends describes)."""
    spec = SCHEDULES.get(name) if isinstance(name, str) else None
    return spec is not None and spec.holds_warmup_send


def schedule_name(text: str, where: str = "schedule") -> str:
    """The registry's name for a schedule as a person types it ('ZB', ' 1F1B ' -> 'zb', '1f1b'): every
    command reads --schedule through this one lookup, so they accept the same spellings; plans keep
    the registry's name. ScheduleError names `where` (the flag) and the known names otherwise."""
    name = text.strip().lower() if isinstance(text, str) else text
    if name not in SCHEDULES:
        raise ScheduleError(f"{where}: unknown schedule {str(text)[:60]!r}", f"use one of {', '.join(SCHEDULE_NAMES)}")
    return name
