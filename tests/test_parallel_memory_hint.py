"""The memory figure of `pplan partition --nodes`'s refusal: one number, the least memory per GPU a
search was found to plan at, named alike in the lead ("needs about X") and the fix ("GPUs with at
least X (the plan found there)"), the plan's peak within it; the failed search's own bound (check_hints
False) is at most that. Before, the lead named the static bound (516 MiB here) and the fix the
first of 1.5x, 2x, 4x that bound which fitted (774 MiB): two figures for one question."""

import math
import re

import pytest

from planner.errors import InfeasibleError
from planner.hardware import load_hardware
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile
from planner.units import parse_bytes

SPEC = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"
KW = dict(hardware="a100-80gb", nodes=1, gpus_per_node=8, global_batch=64)


@pytest.fixture(scope="module")
def profile():
    return analytic_profile(SPEC, load_hardware("a100-80gb"), "bfloat16", [1, 2, 4, 8])


def _refusal(profile, **kw) -> InfeasibleError:
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(profile, **KW, **kw)
    return e.value


@pytest.mark.parametrize("memory", ["300MiB", "512MiB"])
def test_the_lead_and_the_memory_fix_name_one_figure_that_was_searched_and_is_the_least(profile, memory):
    hint = _refusal(profile, memory_bytes=parse_bytes(memory)).hint
    lead = re.search(r"the least memory-hungry plan found needs about (\S+) per GPU", hint).group(1)
    fix = re.search(r"GPUs with at least (\S+) \((dp=\S+) ", hint)
    assert fix.group(1) == lead
    figure = parse_bytes(lead)
    best = plan_parallel(profile, memory_bytes=figure, top_k=1, **KW).best
    assert best.fits and best.config.describe() == fix.group(2) and best.peak_memory_bytes <= figure
    # the least: 2% less memory fits no plan
    _refusal(profile, memory_bytes=0.98 * figure)
    # the unchecked refusal states the failed search's bound, which the checked figure does not undercut
    bound = _refusal(profile, memory_bytes=parse_bytes(memory), check_hints=False).hint
    assert parse_bytes(re.search(r"needs about (\S+) per GPU or more", bound).group(1)) <= figure


def test_every_memory_figure_in_a_refusal_is_one_number(profile):
    hint = _refusal(profile, memory_bytes=parse_bytes("300MiB")).hint
    sizes = {parse_bytes(s) for s in re.findall(r"(?:about|at least) ([\d.]+[KMG]iB)", hint)}
    assert len(sizes) == 1, hint


def test_when_the_dps_plans_fit_but_none_does_once_simulated_the_least_simulated_peak_is_named(profile, monkeypatch):
    from types import SimpleNamespace

    from planner.partition import parallel_search

    peaks, calls = iter(range(1, 10**6)), []

    def simulate(ctx, task, sol, mem, flops):  # every plan simulated over the limit: 5 GiB and up
        calls.append(task)
        return SimpleNamespace(iteration_ms=1000.0, fits=False, config=task.cfg, micro_batch_size=task.b, mfu=0.5,
                               peak_memory_bytes=5 * 2**30 + next(peaks) * 2**20)

    # the name the search calls (it imports simulate_task from parallel_eval): patching
    # parallel_eval.simulate_task instead would leave the search simulating for real
    monkeypatch.setattr(parallel_search, "simulate_task", simulate)
    hint = _refusal(profile, check_hints=False).hint
    assert calls, "the search did not call the patched simulate_task"
    assert "the least memory-hungry plan simulated needs about 5.01GiB per GPU" in hint, hint


GPIPE = dict(hardware="a100-80gb", nodes=4, gpus_per_node=8, global_batch=64, schedules=("gpipe",))
"""Held to gpipe, 32 GPUs of a 24-layer gpt: the bounds climb slowly, so the fix is found at a
multiple of the last and bisected down (measured: 4 bounds, 1.5x fits, 8 more searches)."""


def test_the_memory_fix_bisected_down_from_a_multiple_is_the_least_size_on_a_grid():
    prof = analytic_profile("gpt:layers=24,hidden=1024,heads=16,seq=2048,vocab=32000", load_hardware("a100-80gb"),
                            "bfloat16", [1, 2, 4, 8])
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(prof, memory_bytes=parse_bytes("100MiB"), **GPIPE)
    figure = parse_bytes(re.search(r"GPUs with at least (\S+) ", e.value.hint).group(1))
    with pytest.raises(InfeasibleError) as unchecked:
        plan_parallel(prof, memory_bytes=parse_bytes("100MiB"), check_hints=False, **GPIPE)
    bound = parse_bytes(re.search(r"needs about (\S+) per GPU or more", unchecked.value.hint).group(1))
    assert plan_parallel(prof, memory_bytes=figure, top_k=1, **GPIPE).best.peak_memory_bytes <= figure
    # brute force: no size on a 1% grid from the figure down to the failed search's bound fits
    grid = [figure * (1 - 0.01 * k) for k in range(1, 100) if figure * (1 - 0.01 * k) >= bound]
    assert len(grid) > 5 and figure > 1.05 * bound  # the bounds alone did not reach the figure
    for size in grid:
        with pytest.raises(InfeasibleError):
            plan_parallel(prof, memory_bytes=size, top_k=1, check_hints=False, **GPIPE)


def _fits_between(*spans: tuple[float, float]):
    """Whether a size in GiB fits: inside one of the half-open spans."""
    return lambda gib: any(lo <= gib < hi for lo, hi in spans)


@pytest.mark.parametrize("fits", [_fits_between((1.3, math.inf)), _fits_between((1.25, 1.4), (1.6, math.inf))],
                         ids=["monotone", "not-monotone"])
def test_the_memory_fix_is_a_searched_fit_with_the_size_just_below_searched_and_failing(fits):
    from types import SimpleNamespace

    from planner.hardware import Hardware
    from planner.partition.parallel_hints import Shortfall, infeasible_error

    searched: dict[float, bool] = {}
    gib = 2**30

    def attempt(change):  # a search: fits or a simulated peak 2% over the size (not a bound: the bounds creep)
        size = round(change.get("memory_bytes", 0.5 * gib) / gib, 4)  # the printed size, in GiB
        searched[size] = fits(size)
        if not searched[size]:
            return Shortfall(peak_bytes=1.02 * size * gib, simulated=True)
        best = SimpleNamespace(config=SimpleNamespace(describe=lambda: "dp=1,pp=2,tp=1"), schedule_label="1f1b",
                               n_microbatches=8, recompute="none", peak_memory_bytes=0.99 * size * gib)
        return SimpleNamespace(best=best)

    args = dict(nodes=1, gpus_per_node=8, parallel="auto", recompute="auto", microbatches=None, schedules=None,
                memory_bytes=0.5 * gib, hardware=Hardware.__new__(Hardware))
    object.__setattr__(args["hardware"], "name", "fake")
    hint = infeasible_error(Shortfall(peak_bytes=1.0 * gib, simulated=True), args, attempt).hint
    figure = round(parse_bytes(re.search(r"GPUs with at least (\S+) ", hint).group(1)) / gib, 4)
    memory_searches = [s for s in searched if s != 0.5]
    assert len(memory_searches) <= 4 + 3 + 8, memory_searches  # bounds, multiples, bisection
    assert searched.get(figure) is True  # the figure was searched and fits
    assert searched.get(round(figure - 0.01, 2)) is False  # the size printed just below was searched: no plan
    least = min(k / 100 for k in range(100, 300) if fits(k / 100))  # brute force over the printed sizes
    assert figure == least, (figure, least, sorted(searched))
