"""What `pplan partition --nodes` says when it refuses: every fix its hint names is one that works
(searched again before it is printed), the flags that held the search first; a forced layout's
schedule refusal names the layout, not the GPUs; option refusals carry a hint with the values."""

import re

import pytest

from planner.errors import InfeasibleError, PplanError, ScheduleError
from planner.hardware import load_hardware
from planner.parallel import ParallelConfig
from planner.partition.options import cluster_settings_from_options, parse_microbatches
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile
from planner.units import parse_bytes
from helpers.cli import one_error_line

SPEC = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"
# the reviewer's case: 8 GPUs of 1 GiB, held to 8 micro-batches without recompute
HELD = dict(hardware="h100-80gb", nodes=1, global_batch=64, microbatches=8, recompute="none", memory_bytes=2**30)


@pytest.fixture(scope="module")
def profile():
    return analytic_profile(SPEC, load_hardware("h100-80gb"), "float32", [1, 2, 4, 8])


def _fixes(hint: str) -> list[str]:
    """The fixes after 'use ' in an InfeasibleError's hint, one string each."""
    text = hint.split(": use ", 1)[1]
    return [f.strip() for f in re.split(r", or |, (?=--|\d+ GPUs|GPUs with)", text)]


def _change(fix: str) -> dict:
    """The plan_parallel arguments a printed fix stands for."""
    flag = fix.split(" (")[0]
    if m := re.match(r"(?:about )?\d+ GPUs \((\d+) nodes of \d+( with --parallel auto)?", fix):
        return {"nodes": int(m.group(1)), **({"parallel": "auto"} if m.group(2) else {})}
    if m := re.match(r"GPUs with at least (\S+)", fix):
        return {"memory_bytes": parse_bytes(m.group(1))}
    if m := re.fullmatch(r"--zero (\d)", flag):
        return {"zero": int(m.group(1))}
    changes = {"--microbatches auto": {"microbatches": None}, "--recompute auto": {"recompute": "auto"},
               "--schedule auto": {"schedules": None}, "--parallel auto": {"parallel": "auto"}}
    out = {}
    for part in re.findall(r"--\w+ auto", flag):
        out.update(changes[part])
    assert out, f"cannot read the fix {fix!r}"
    return out


def _check_every_fix_works(profile, kwargs: dict) -> list[str]:
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(profile, **kwargs)
    fixes = _fixes(e.value.hint)
    assert fixes, e.value.hint
    for fix in fixes:
        best = plan_parallel(profile, **{**kwargs, **_change(fix)}).best  # raises when the fix does not work
        assert best.fits, fix
    return fixes


def test_every_fix_named_for_a_held_search_works_and_the_held_flags_come_first(profile):
    fixes = _check_every_fix_works(profile, HELD)
    assert fixes[0].startswith("--microbatches auto (dp=1,pp=8,tp=1")  # the same 8 GPUs fit with the count free


def test_a_zero_stage_that_does_not_fit_is_not_offered(profile):
    # with ZeRO-1 the bound offered --zero 3, under which the held search still needs more than 1 GiB
    fixes = _check_every_fix_works(profile, {**HELD, "zero": 1})
    assert not any(f.startswith("--zero") for f in fixes)


def test_a_forced_layout_names_parallel_auto_and_every_fix_works(profile):
    kwargs = {**HELD, "microbatches": None, "parallel": "dp=8,pp=1,tp=1"}
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(profile, **kwargs)
    assert "with --parallel dp=8,pp=1,tp=1 and --recompute none on 8 GPUs" in e.value.message
    fixes = _check_every_fix_works(profile, kwargs)
    assert fixes[0].startswith("--parallel auto")


def test_a_schedule_refused_on_a_forced_layout_names_it_and_a_layout_that_runs_it(profile):
    kw = dict(hardware="h100-80gb", nodes=1, global_batch=64, schedules=("interleaved",))
    with pytest.raises(ScheduleError) as e:
        plan_parallel(profile, parallel="dp=8,pp=1,tp=1", **kw)
    assert "runs nowhere on dp=8,pp=1,tp=1: choose another --schedule, or --parallel auto" in e.value.hint
    named = re.search(r"--parallel auto \((\S+) runs it\)", e.value.hint).group(1)
    assert plan_parallel(profile, parallel=named, **kw).best.schedule == "interleaved"
    assert plan_parallel(profile, **kw).best.schedule == "interleaved"


def test_zero_microbatches_is_refused_with_a_hint():
    with pytest.raises(PplanError) as e:
        parse_microbatches("0")
    assert "got 0" in e.value.message and "--microbatches auto" in (e.value.hint or "")


def test_an_unknown_zero_stage_is_refused_with_the_stages_named():
    with pytest.raises(PplanError) as e:
        ParallelConfig(zero=5)
    assert "got 5" in e.value.message and "--zero 1" in (e.value.hint or "")


def test_a_misspelt_grad_sync_names_the_nearest_mode():
    with pytest.raises(PplanError) as e:
        cluster_settings_from_options(nodes=1, hardware="h100-80gb", global_batch=64, grad_sync="overlap")
    assert "'overlap'" in e.value.message and "did you mean 'overlapped'?" in e.value.hint


def test_the_cli_names_the_held_flag_first(pplan, tmp_path):
    csv = tmp_path / "g.csv"
    assert pplan("profile", "--analytic", "-m", SPEC, "--hardware", "h100-80gb", "-b", "1,2,4,8", "-o", csv)[0] == 0
    code, _, err = pplan("partition", csv, "--hardware", "h100-80gb", "--nodes", 1, "--global-batch", 64, "--microbatches", 8,
                         "--recompute", "none", "--memory", "1GiB", "-o", tmp_path / "o.json")
    line = one_error_line(code, err)
    assert "and --microbatches 8 --recompute none on 8 GPUs" in line and ": use --microbatches auto (" in line
    assert not (tmp_path / "o.json").exists()
