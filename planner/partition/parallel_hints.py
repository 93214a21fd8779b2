"""What `pplan partition --nodes` says when no plan fits: an InfeasibleError whose every fix was
searched again and found to fit (planner.partition.parallel_search raises it).

A failed search leaves a `Shortfall`: the least memory per GPU it knows a plan needs. That is a
lower bound (the static bytes of the layouts skipped for memory; the pipeline DP's least memory
scale over the points it solved), or, when the DP's plans fit but none does once simulated, the
least simulated peak among them. The refusal names one memory figure: the least memory per GPU
at which a search was found to plan, reached by searching again at the bound each failed search
leaves (a tighter one every time; GPT-3 175B on 8 GiB: 9.75 GiB of weights, then 10.01 GiB,
which fits), so the lead ("needs about X") and the fix ("GPUs with at least X (plan)") are the
same number and the plan named is the one found there, its peak within X. Every other fix (the held flags
freed, more nodes, a ZeRO stage) is a search that fit too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from planner.errors import InfeasibleError, PplanError
from planner.partition.parallel_checks import MAX_GPUS
from planner.units import format_bytes, format_size_up, parse_bytes

__all__ = ["Shortfall", "infeasible_error"]

Attempt = Callable[[dict[str, Any]], Any]
"""Search again with some of plan_parallel's arguments changed: its result (a ParallelResult) or,
when nothing fits, its Shortfall; PplanError when the change cannot run at all."""

_BOUND_SEARCHES = 4  # searches at successive lower bounds before falling back to multiples of the last
_MULTIPLES = (1.5, 2.0, 4.0)


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


def infeasible_error(short: Shortfall, args: dict[str, Any], attempt: Attempt | None) -> InfeasibleError:
    """The refusal of plan_parallel(**args) (normalized: hardware a Hardware, parallel a forced
    ParallelConfig or "auto"), naming the fixes `attempt` confirms (None: no search, the bound only)."""
    n, forced = args["nodes"] * args["gpus_per_node"], args["parallel"]
    auto = {"parallel": "auto"} if forced != "auto" else {}
    flags = " ".join(t for t in (short.held_to, "--recompute none" if args["recompute"] == "none" else "") if t)
    where = (f"--parallel {forced.describe()}" if auto else "every dp x pp x tp layout") + (f" and {flags}" if flags else "")
    error = f"no plan fits {format_bytes(args['memory_bytes'])} per GPU ({args['hardware'].name}) with {where} on {n} GPUs"
    if attempt is None:
        return InfeasibleError(error, _bound_lead(short) or "more memory per GPU")
    fixes, notes = _held_fixes(args, short.held_to, auto, attempt), []
    fixes.append(_nodes_fix(args, short.need_bytes, auto, attempt, notes))
    size, memory_fix = _memory_fix(short.need_bytes, attempt, notes)
    fixes.append(memory_fix)
    if short.zero_hint is not None:  # a stage under which some layout's static bytes fit (helping_zero)
        sharded = {"parallel": replace(forced, zero=short.zero_hint)} if auto else {}
        fixes.append(_fix(attempt, f"--zero {short.zero_hint}", {"zero": short.zero_hint, **sharded}))
    head = f"the least memory-hungry plan found needs about {size} per GPU" if size else _bound_lead(short)
    fixes, lead = [f for f in fixes if f], " ".join(t for t in (head, f"({'; '.join(notes)})" if notes else "") if t)
    use = "use " + ", ".join(fixes[:-1]) + (", or " if fixes[1:] else "") + fixes[-1] if fixes else "no change tried fits"
    return InfeasibleError(error, (lead + ": " if lead else "") + use)


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
    """More nodes of the same GPUs that fit (the first of three node counts from the need), else ''
    and a note naming the GPU counts tried."""
    nodes, gpn, mem = args["nodes"], args["gpus_per_node"], args["memory_bytes"]
    more = max(nodes + 1, math.ceil(nodes * need / mem) if math.isfinite(need) else 2 * nodes)
    tries = [k for k in (more, 2 * more, 4 * more) if k * gpn <= MAX_GPUS]
    fix = next((f for f in (_fix(attempt, f"{k * gpn} GPUs ({k} nodes of {gpn}{' with --parallel auto' if auto else ''})",
                                 {"nodes": k, **auto}) for k in tries) if f), "")
    if tries and not fix:
        notes.append(f"{', '.join(str(k * gpn) for k in tries)} GPUs do not fit either")
    return fix


def _memory_fix(need: float, attempt: Attempt, notes: list[str]) -> tuple[str, str]:
    """(X, 'GPUs with at least X (the plan found)') for the least memory per GPU X found to fit:
    searched at the bound each failed search leaves, then at multiples of the last; a fit at a
    multiple is searched again at its plan's peak. ('', '') with a note when none fits."""
    if not math.isfinite(need):
        return "", ""
    bound = need
    for _ in range(_BOUND_SEARCHES):
        size = format_size_up(bound)
        got = _search(attempt, {"memory_bytes": parse_bytes(size)})
        if got is not None and not isinstance(got, Shortfall):
            return size, _describe(f"GPUs with at least {size}", got.best)
        tighter = got.need_bytes if isinstance(got, Shortfall) else math.inf
        if not (math.isfinite(tighter) and tighter > parse_bytes(size)):
            break
        bound = tighter
    sizes = [format_size_up(bound * x) for x in _MULTIPLES]
    found = next(((x, r) for x in sizes for r in [_search(attempt, {"memory_bytes": parse_bytes(x)})]
                  if r is not None and not isinstance(r, Shortfall)), None)
    if found is None:
        notes.append(f"GPUs with {sizes[-1]} do not fit either")
        return "", ""
    size, result = found
    peak = format_size_up(result.best.peak_memory_bytes)
    if parse_bytes(peak) < parse_bytes(size):  # the plan found may need less than the multiple it was searched at
        again = _search(attempt, {"memory_bytes": parse_bytes(peak)})
        if again is not None and not isinstance(again, Shortfall):
            size, result = peak, again
    return size, _describe(f"GPUs with at least {size}", result.best)


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
