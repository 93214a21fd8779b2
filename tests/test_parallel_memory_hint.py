"""The memory figure of `pplan partition --nodes`'s refusal: one number, the least memory per GPU a
search was found to plan at, named alike in the lead ("needs about X") and the fix ("GPUs with at
least X (the plan found there)"), the plan's peak within it; the failed search's own bound (check_hints
False) is at most that. Before, the lead named the static bound (516 MiB here) and the fix the
first of 1.5x, 2x, 4x that bound which fitted (774 MiB): two figures for one question."""

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

    peaks = iter(range(1, 10**6))

    def simulate(ctx, task, sol, mem, flops):  # every plan simulated over the limit: 5 GiB and up
        return SimpleNamespace(iteration_ms=1000.0, fits=False, config=task.cfg, micro_batch_size=task.b, mfu=0.5,
                               peak_memory_bytes=5 * 2**30 + next(peaks) * 2**20)

    monkeypatch.setattr(parallel_search, "simulate_task", simulate)
    hint = _refusal(profile, check_hints=False).hint
    assert "the least memory-hungry plan simulated needs about 5.01GiB per GPU" in hint, hint
