"""What `pplan partition --nodes` says when no plan fits: an InfeasibleError whose every fix was
searched again and found to fit (planner.partition.parallel_search raises it).

A failed search leaves a `Shortfall`: the least memory per GPU it knows a plan needs. That is a
lower bound (the static bytes of the layouts skipped for memory; the pipeline DP's least memory
scale over the points it solved), or, when the DP's plans fit but none does once simulated, the
least simulated peak among them. The refusal names one memory figure: the least memory per GPU
at which a search was found to plan, so the lead ("needs about X") and the fix ("GPUs with at
least X (plan)") are the same number and the plan named is the one found there, its peak within
X. It is found by searching again at the bound each failed search leaves (a tighter one every
time), then at multiples of the last, and bisecting between the last size that failed and the
first that fit, to the precision format_size_up prints or for at most 8 searches. GPT-3 175B on
4 x 8 A100s at 8 GiB, global batch 64: the bounds 81.61 .. 85.79 GiB fit no plan, 1.5 times the
last bound (135.16 GiB) does, and bisecting finds 102.46 GiB (102.29 GiB fits none). Fitting need
not grow with the memory (there 105-120 GiB fit, 125 and 130 GiB do not: the search simulates only
its fastest plans), so X is the least size of the fit it narrows, with a smaller size just below it
found not to fit. Every other fix (the held flags freed, more nodes, a ZeRO stage) is a search that
fit too.

When the search priced no point, memory may not be why: a global batch that no layout splits into at most
MAX_MICROBATCHES micro-batches per replica of a searched size (1,048,576 samples on 16 GPUs with
sizes to 8: at most 16 x 4096 x 8 = 524,288) is refused for that, with its searched fixes: a held
--microbatches, more nodes, the largest batch that splits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from planner.errors import InfeasibleError, PplanError, ScheduleError
from planner.partition.parallel_checks import MAX_GPUS, MAX_MICROBATCHES
from planner.partition.search import divisors
from planner.units import format_bytes, format_size_up, parse_bytes

__all__ = ["Shortfall", "infeasible_error", "searched_micro_batch_sizes"]

Attempt = Callable[[dict[str, Any]], Any]
"""Search again with some of plan_parallel's arguments changed: its result (a ParallelResult) or,
when nothing fits, its Shortfall; PplanError when the change cannot run at all."""

_BOUND_SEARCHES = 4  # searches at successive lower bounds before falling back to multiples of the last
_MULTIPLES = (1.5, 2.0, 4.0)
# Searches that narrow a fitting size down to the least (each a full cluster search, top_k 1).
# Halving from a 1.5x multiple, 8 reach the 0.01 GiB format_size_up prints on ranges up to
# 2.56 GiB and within 0.4% of the figure on any, so the memory fix costs at most 4 + 3 + 8 = 15
# searches.
_BISECT_SEARCHES = 8


@dataclass(frozen=True)
class Shortfall:
    """What a search that found no plan knows of the memory a plan needs."""

    static_bytes: float = math.inf
    """Least per-GPU static bytes (weights, gradients, optimizer) of the layouts skipped for memory,
    a lower bound of what they need; inf when none was skipped."""
    peak_bytes: float = math.inf
    """Least memory per GPU under which the pipeline DP fits some point it solved (a lower bound),
    or with `simulated` the least simulated peak of its plans; inf when no point was priced."""
    simulated: bool = False
    """The DP's plans fit but none did once simulated: `peak_bytes` is a simulated peak, not a bound."""
    zero_hint: int | None = None
    """A ZeRO stage under which some layout's static bytes fit (parallel_eval.helping_zero), or None."""
    held_to: str = ""
    """The flags the search was held to ('--schedule 1f1b --microbatches 32'; '' for none)."""

    @property
    def need_bytes(self) -> float:
        """The least memory per GPU the search knows a plan needs (inf: unknown)."""
        return self.peak_bytes if self.simulated else min(self.static_bytes, self.peak_bytes)


def infeasible_error(short: Shortfall, args: dict[str, Any], attempt: Attempt | None,
                     least: Callable[[], float] | None = None) -> PplanError:
    """The refusal of plan_parallel(**args) (normalized: hardware a Hardware, parallel a forced
    ParallelConfig or "auto"), naming the fixes `attempt` confirms (None: no search, the bound only).
    `least`: the least memory per GPU the search's pipeline DP fits some point under (the memory
    fix then searches there once; None, or a search there that finds nothing: _memory_fix's bounds).
    When the search priced no point, memory may not be why: a batch that no layout splits, memory
    aside, is refused with a ScheduleError (_split_refusal)."""
    if not math.isfinite(short.peak_bytes):
        split = _split_refusal(args, attempt)
        if split is not None:
            return split
    n, forced = args["nodes"] * args["gpus_per_node"], args["parallel"]
    auto = {"parallel": "auto"} if forced != "auto" else {}
    flags = " ".join(t for t in (short.held_to, "--recompute none" if args["recompute"] == "none" else "") if t)
    where = (f"--parallel {forced.describe()}" if auto else "every dp x pp x tp layout") + (f" and {flags}" if flags else "")
    error = (f"no plan fits {format_bytes(args['memory_bytes'])} per GPU ({args['hardware'].name}) with {where} "
             f"on {n} GPU{'' if n == 1 else 's'}")
    if attempt is None:
        return InfeasibleError(error, _bound_lead(short) or "more memory per GPU")
    fixes, notes = _held_fixes(args, short.held_to, auto, attempt), []
    fixes.append(_nodes_fix(args, short.need_bytes, auto, attempt, notes))
    size, memory_fix = _memory_fix(short, args["memory_bytes"], attempt, notes, least)
    fixes.append(memory_fix)
    if short.zero_hint is not None:  # a stage under which some layout's static bytes fit (helping_zero)
        sharded = {"parallel": replace(forced, zero=short.zero_hint)} if auto else {}
        fixes.append(_fix(attempt, f"--zero {short.zero_hint}", {"zero": short.zero_hint, **sharded}))
    head = f"the least memory-hungry plan found needs about {size} per GPU" if size else _bound_lead(short)
    fixes, lead = [f for f in fixes if f], " ".join(t for t in (head, f"({'; '.join(notes)})" if notes else "") if t)
    use = _use(fixes) if fixes else "no change tried fits"
    return InfeasibleError(error, (lead + ": " if lead else "") + use)


def _use(fixes: list[str]) -> str:
    """'use A, B, or C' of one or more fixes."""
    return "use " + ", ".join(fixes[:-1]) + (", or " if fixes[1:] else "") + fixes[-1]


def searched_micro_batch_sizes(given: Sequence[int] | None, profile_sizes: Sequence[int]) -> list[int]:
    """The micro-batch sizes a search not held to a micro-batch count tries: the given ones, else the
    profile's and the powers of two up to 8."""
    return sorted(set(given)) if given else sorted(set(profile_sizes) | {1, 2, 4, 8})


def _largest_split(global_batch: int, dps: Sequence[int], sizes: Sequence[int]) -> int:
    """The largest batch up to `global_batch` that some replica count of `dps` and micro-batch size of
    `sizes` split into at most MAX_MICROBATCHES micro-batches per replica (`global_batch` when it splits)."""
    return max(dp * b * min(MAX_MICROBATCHES, global_batch // (dp * b)) for dp in dps for b in sizes)


def _split_refusal(args: dict[str, Any], attempt: Attempt | None) -> ScheduleError | None:
    """The refusal when no layout of the search `args` can split its global batch, memory aside:
    without a held micro-batch count each replica runs at most MAX_MICROBATCHES micro-batches of a
    searched size, so dp x that count x the largest size caps the batch (16 GPUs, sizes to 8:
    524,288 samples), and dp x size must divide it. Every layout's dp divides the GPUs, so over
    those divisors a batch that does not split here splits on no layout searched. Its fixes, each
    searched (`attempt`): a held --microbatches (any micro-batch size then), the fewest more nodes
    that split it, the largest batch that splits; None when the batch splits."""
    given, batch = args["micro_batch_sizes"], args["global_batch"]
    if args["microbatches"] is not None:  # held: parallel_checks.check_held_runs says what runs
        return None
    nodes, gpn, forced = args["nodes"], args["gpus_per_node"], args["parallel"]
    sizes = searched_micro_batch_sizes(given, args["profile"].micro_batch_sizes)
    dps = divisors(nodes * gpn) if forced == "auto" else [forced.dp]
    largest = _largest_split(batch, dps, sizes)
    if largest == batch:
        return None
    where, replicas = (f"{nodes * gpn} GPUs", f"a divisor of {nodes * gpn}") if forced == "auto" else \
        (f"--parallel {forced.describe()}", f"dp={forced.dp}")
    cap = dps[-1] * MAX_MICROBATCHES * sizes[-1]
    listed = ", ".join(map(str, sizes[:-1])) + (" or " if sizes[1:] else "") + str(sizes[-1])
    why = (f" ({dps[-1]} replicas x {MAX_MICROBATCHES} x {sizes[-1]} = {cap} samples at most)" if batch > cap else
           f", and no replica count ({replicas}) x micro-batch size divides {batch} into so few")
    error = (f"--global-batch {batch} does not split on {where}: the search runs at most {MAX_MICROBATCHES} micro-batches "
             f"per replica, of {listed} samples{why}")
    tries = []
    held = _finest_held_count(batch, dps) if not given else None  # given sizes bound a held count's size too
    if held is not None:
        tries.append((f"--microbatches {held}", {"microbatches": held}))
    more = _fewest_nodes_splitting(batch, nodes, gpn, sizes) if forced == "auto" else None  # forced: more nodes is another layout
    if more is not None:
        tries.append((f"{more * gpn} GPUs ({more} nodes of {gpn})", {"nodes": more}))
    if largest >= 1:
        tries.append((f"--global-batch {largest}", {"global_batch": largest}))
    if attempt is None:
        return ScheduleError(error, "e.g. " + " or ".join(flag for flag, _ in tries) if tries else None)
    fixes = [f for f in (_fix(attempt, flag, change) for flag, change in tries) if f]
    tried = " or ".join(flag for flag, _ in tries)
    return ScheduleError(error, _use(fixes) if fixes else f"{tried} fit no plan either" if tries else "change --global-batch")


def _finest_held_count(global_batch: int, dps: Sequence[int]) -> int | None:
    """The micro-batch count per replica, at most MAX_MICROBATCHES, that splits the batch into the
    smallest micro-batches over some replica count of `dps` (a held count runs them at any size);
    None when no replica count divides the batch."""
    finest = max(((dp * m, m) for dp in dps if global_batch % dp == 0
                  for m in [max(d for d in divisors(global_batch // dp) if d <= MAX_MICROBATCHES)]), default=None)
    return None if finest is None else finest[1]


_NODE_COUNTS_TRIED = 64  # node counts looked at from the least that could hold the batch (arithmetic, no search)


def _fewest_nodes_splitting(global_batch: int, nodes: int, gpn: int, sizes: Sequence[int]) -> int | None:
    """The fewest nodes above `nodes` (at most MAX_GPUS GPUs) over whose GPUs some layout splits the
    batch; None when none of the first _NODE_COUNTS_TRIED from the least that could does."""
    least = max(nodes + 1, math.ceil(global_batch / (gpn * MAX_MICROBATCHES * sizes[-1])))
    return next((k for k in range(least, min(least + _NODE_COUNTS_TRIED, MAX_GPUS // gpn + 1))
                 if _largest_split(global_batch, divisors(k * gpn), sizes) == global_batch), None)


def _bound_lead(short: Shortfall) -> str:
    """The memory a plan needs as far as the failed search knows, unchecked ('' when unknown)."""
    if not math.isfinite(short.need_bytes):
        return ""
    if short.simulated:
        return f"the least memory-hungry plan simulated needs about {format_size_up(short.need_bytes)} per GPU"
    return f"the least memory-hungry layout needs about {format_size_up(short.need_bytes)} per GPU or more"


def _held_fixes(args: dict[str, Any], held_to: str, auto: dict[str, Any], attempt: Attempt) -> list[str]:
    """The flags that held the search, each freed (all together when none alone fits), that fit."""
    held = [(f, c) for f, c, on in (("--microbatches auto", {"microbatches": None}, args["microbatches"] is not None),
                                    ("--schedule auto", {"schedules": None}, bool(args["schedules"])),
                                    ("--recompute auto", {"recompute": "auto"}, args["recompute"] == "none"),
                                    ("--parallel auto", auto, bool(auto))) if on]
    fixes = [_fix(attempt, f, c) for f, c in held]
    if len(held) > 1 and not any(fixes):
        fixes.append(_fix(attempt, " ".join(f for f, _ in held), {k: v for _, c in held for k, v in c.items()}))
    return fixes


def _nodes_fix(args: dict[str, Any], need: float, auto: dict[str, Any], attempt: Attempt, notes: list[str]) -> str:
    """More nodes of the same GPUs that fit (the first of three node counts from the need), else ''.
    Searched over every layout, they say, when none fits, that scaling out does not help (a note);
    not for a forced layout (`auto` set), where more nodes means another layout and the note named GPU
    counts far from the one asked about (1312 GPUs for a 16-GPU layout that needed more memory per GPU)."""
    nodes, gpn, mem = args["nodes"], args["gpus_per_node"], args["memory_bytes"]
    more = max(nodes + 1, math.ceil(nodes * need / mem) if math.isfinite(need) else 2 * nodes)
    tries = [k for k in (more, 2 * more, 4 * more) if k * gpn <= MAX_GPUS]
    fix = next((f for f in (_fix(attempt, f"{k * gpn} GPUs ({k} nodes of {gpn}{' with --parallel auto' if auto else ''})",
                                 {"nodes": k, **auto}) for k in tries) if f), "")
    if tries and not fix and not auto:
        counts = [f"{k * gpn:,}" for k in tries]
        listed = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
        notes.append(f"more nodes do not help: {listed} GPUs fit no plan either")
    return fix


def _memory_fix(short: Shortfall, searched_bytes: float, attempt: Attempt, notes: list[str],
                least: Callable[[], float] | None = None) -> tuple[str, str]:
    """(X, 'GPUs with at least X (the plan found)') for the least memory per GPU X found to fit,
    after the failed search of `searched_bytes` per GPU left `short`: where `least` names the least
    memory the search's DP fits, that size printed rounded up, once a search there finds a plan (one
    search where bisecting took about a dozen); else the first size that fits (_first_fit), then
    bisected down (_least_fit). ('', '') with a note when none fits."""
    if not math.isfinite(short.need_bytes):
        return "", ""
    exact = least() if least is not None else math.inf
    if math.isfinite(exact) and exact > searched_bytes:
        size = format_size_up(exact)
        got = _search(attempt, {"memory_bytes": parse_bytes(size)})
        if _fits(got):
            return size, _describe(f"GPUs with at least {size}", got.best)
    floor, fit, tried = _first_fit(short.need_bytes, _raised_floor(0.0, searched_bytes, short), attempt)
    if fit is None:
        notes.append(f"GPUs with {tried} do not fit either")
        return "", ""
    size, result = _least_fit(floor, fit, attempt)
    return size, _describe(f"GPUs with at least {size}", result.best)


def _first_fit(need: float, floor: float, attempt: Attempt) -> tuple[float, tuple[str, Any] | None, str]:
    """(the floor the searches raised, the first (size, result) found to fit or None, the last size
    searched): at the bound each failed search leaves (a tighter one every time), then at
    multiples of the last. `floor`: a byte above the largest size found not to fit, or a failed
    search's bound when higher (_raised_floor)."""
    bound, size = need, ""
    for _ in range(_BOUND_SEARCHES):
        size = format_size_up(bound)
        got = _search(attempt, {"memory_bytes": parse_bytes(size)})
        if _fits(got):
            return floor, (size, got), size
        floor = _raised_floor(floor, parse_bytes(size), got)
        tighter = got.need_bytes if isinstance(got, Shortfall) else math.inf
        if not (math.isfinite(tighter) and tighter > parse_bytes(size)):
            break
        bound = tighter
    for size in [format_size_up(bound * x) for x in _MULTIPLES]:
        got = _search(attempt, {"memory_bytes": parse_bytes(size)})
        if _fits(got):
            return floor, (size, got), size
        floor = _raised_floor(floor, parse_bytes(size), got)
    return floor, None, size


def _least_fit(floor: float, fit: tuple[str, Any], attempt: Attempt) -> tuple[str, Any]:
    """The least size found to fit between `floor` (_first_fit: a byte above a size found not to
    fit, or a bound no plan fits below) and the fitting `fit` (size, result), with its result:
    bisected at the precision format_size_up prints, until the size found has the next printed
    size below it searched and failing (or below the floor), or after _BISECT_SEARCHES searches (fitting need not grow with the memory: the search
    simulates only its fastest plans, so the figure is the least of a fit's neighbourhood)."""
    size, result = fit
    for _ in range(_BISECT_SEARCHES):
        top = parse_bytes(size)
        probe = format_size_up((floor + top) / 2)
        if parse_bytes(probe) >= top:  # the midpoint rounds up to the fit: the least printed size left
            probe = format_size_up(floor)
        if parse_bytes(probe) >= top:
            break
        got = _search(attempt, {"memory_bytes": parse_bytes(probe)})
        if _fits(got):
            size, result = probe, got
        else:
            floor = _raised_floor(floor, parse_bytes(probe), got)
    return size, result


def _raised_floor(floor: float, searched_bytes: float, got: Any) -> float:
    """The floor once a search of `searched_bytes` per GPU found no plan (`got`: its Shortfall, or
    None): above that size, and at the search's bound when it is one (not a simulated peak)."""
    bound = got.need_bytes if isinstance(got, Shortfall) and not got.simulated else 0.0
    return max(floor, searched_bytes + 1, bound)


def _fits(got: Any) -> bool:
    """Whether a search's outcome (_search) is a plan that fits, not a Shortfall or None."""
    return got is not None and not isinstance(got, Shortfall)


def _search(attempt: Attempt, change: dict[str, Any]) -> Any:
    """attempt(change), or None when the change cannot run at all (a PplanError)."""
    try:
        return attempt(change)
    except PplanError:
        return None


def _fix(attempt: Attempt, flag: str, change: dict[str, Any]) -> str:
    """`flag` and the plan it gives when a search with `change` finds one that fits, else ''."""
    got = _search(attempt, change)
    return "" if got is None or isinstance(got, Shortfall) else _describe(flag, got.best)


def _describe(flag: str, best: Any) -> str:
    """'FLAG (dp=..,pp=..,tp=.. 1f1b, M=32, recompute full)': a fix and the plan it was found to give."""
    return f"{flag} ({best.config.describe()} {best.schedule_label}, M={best.n_microbatches}, recompute {best.recompute})"
