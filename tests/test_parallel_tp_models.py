"""Which models tensor parallelism is planned for: the rule `pplan run` executes by
(planner.partition.parallel_runnable: the built-in gpt, tp dividing its heads and FFN width, read
from the spec alone), applied alike by the 3-D search (a searched layout is left out, a forced one
refused naming layouts that run), preflight and the executor's block split."""

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from planner.errors import PplanError
from planner.execute.preflight import check_parallel
from planner.hardware import load_hardware
from planner.parallel import ParallelConfig
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_runnable import layout_refusal, tp_model_error, tp_shape_error
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile
from helpers.cli import one_error_line

SPEC12 = "gpt:layers=8,hidden=768,heads=12,seq=512,vocab=32000"  # GPT-2 small's 12 heads: tp 8 cannot split them
SPEC16 = "gpt:layers=8,hidden=1024,heads=16,seq=512,vocab=32000"
GPT175B = "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
KW = dict(hardware="a100-80gb", nodes=1, gpus_per_node=8, global_batch=64)


@pytest.fixture(scope="module")
def profile12():
    return analytic_profile(SPEC12, load_hardware("a100-80gb"), "bfloat16", [1, 2, 4, 8])


def test_the_rule_reads_heads_and_ffn_width_from_the_spec():
    assert tp_model_error(GPT175B, 8) is None  # far too large to build here: judged by its spec
    error = tp_model_error(SPEC12, 8)
    assert "tp 8 does not divide the gpt's 12 attention heads and FFN width 3072" in error.message
    assert "(2, 3, 4, 6, 12)" in error.hint
    assert tp_model_error(SPEC12, 4) is None and tp_model_error(SPEC12, 1) is None and tp_model_error("hf:gpt2", 1) is None
    assert "FFN width 100" in tp_shape_error(8, 100, 8).message and tp_shape_error(8, 96, 4) is None
    for spec in ("hf:gpt2:n_layer=2,n_embd=64,n_head=4", "mypackage.models:build", "mlp:layers=4", "not a model!", None):
        error = tp_model_error(spec, 2)
        assert "tensor parallelism (tp 2) runs only on the built-in gpt" in error.message and "tp=1" in error.hint, spec


def test_the_search_leaves_out_tp_the_model_cannot_split_and_keeps_the_rest(profile12):
    result = plan_parallel(profile12, **KW)
    assert {c.config.tp for c in result.candidates} <= {1, 2, 4}
    left_out = [s for s in result.skipped if "12 attention heads" in s]
    assert left_out and all(",tp=8" in s for s in left_out)
    assert len(left_out) == len([s for s in result.skipped if ",tp=8" in s])  # nothing else left tp=8 out
    forced = plan_parallel(profile12, parallel="dp=2,pp=1,tp=4", schedules=("1f1b",), **KW)
    assert forced.best.config.tp == 4  # tp dividing the heads is still planned


def test_a_forced_layout_the_model_cannot_split_is_refused_naming_layouts_that_run(profile12):
    with pytest.raises(PplanError) as e:
        plan_parallel(profile12, parallel="dp=1,pp=1,tp=8", **KW)
    assert e.value.message.startswith("--parallel dp=1,pp=1,tp=8: tp 8 does not divide the gpt's 12 attention heads")
    named = re.findall(r"dp=\d+,pp=\d+,tp=\d+", e.value.hint)
    assert named == ["dp=2,pp=1,tp=4", "dp=8,pp=1,tp=1"]
    for layout in named:
        assert plan_parallel(profile12, parallel=layout, **KW).best.config.describe() == layout


def test_a_profile_of_another_model_or_of_none_is_planned_with_tp_1():
    prof = analytic_profile(SPEC16, load_hardware("a100-80gb"), "bfloat16", [1, 2, 4, 8])
    assert plan_parallel(prof, parallel="dp=4,pp=1,tp=2", **KW).best.config.tp == 2  # the gpt itself gets tp
    for model in ("hf:gpt2:n_layer=8,n_embd=1024,n_head=16", None):
        meta = {k: v for k, v in prof.meta.items() if k != "model"} | ({"model": model} if model else {})
        other = replace(prof, meta=meta)
        result = plan_parallel(other, **KW)
        assert {c.config.tp for c in result.candidates} == {1}
        assert any("runs only on the built-in gpt" in s for s in result.skipped)
        with pytest.raises(PplanError, match="runs only on the built-in gpt"):
            plan_parallel(other, parallel="dp=4,pp=1,tp=2", **KW)


def test_preflight_and_the_block_split_refuse_with_the_searchs_words(profile12):
    plan = parallel_plan(plan_parallel(profile12, parallel="dp=2,pp=2,tp=2", schedules=("1f1b",), **KW), profile12,
                         load_hardware("a100-80gb"))
    check_parallel(plan)  # tp 2 divides 12 heads: runs
    bad = replace(plan, parallel=replace(plan.parallel, dp=1, tp=8))
    with pytest.raises(PplanError) as e:
        check_parallel(bad)
    assert e.value.one_line() == layout_refusal(ParallelConfig(dp=1, pp=2, tp=8), SPEC12)
    from planner.execute.tensor import parallelize_blocks
    from planner.models.gpt import Block

    with pytest.raises(PplanError) as e:
        parallelize_blocks([Block(48, 12, 4)], SimpleNamespace(size=lambda: 8))
    assert e.value.message == tp_shape_error(12, 192, 8).message


def test_the_cli_refuses_a_forced_layout_in_one_line(pplan, tmp_path):
    csv = tmp_path / "g12.csv"
    assert pplan("profile", "--analytic", "-m", SPEC12, "--hardware", "a100-80gb", "-b", "1,2", "-o", csv)[0] == 0
    code, _, err = pplan("partition", csv, "--nodes", 1, "--hardware", "a100-80gb", "--global-batch", 64,
                         "--parallel", "dp=1,pp=1,tp=8", "-o", tmp_path / "p.json")
    line = one_error_line(code, err)
    assert "tp 8 does not divide the gpt's 12 attention heads" in line and "--parallel dp=2,pp=1,tp=4" in line
    assert not (tmp_path / "p.json").exists()


def test_the_layout_figure_has_no_point_for_tp_the_model_cannot_split(profile12):
    from planner.partition.parallel_sweep import layout_sweep

    points = layout_sweep(profile12, hardware="a100-80gb", nodes=1, gpus_per_node=8, global_batch=64, schedules=("1f1b",))
    by_tp = {t: [p for p in points if p.config.tp == t] for t in (4, 8)}
    assert by_tp[8] and all(p.tflops_per_gpu is None and not p.fits for p in by_tp[8])
    assert any(p.tflops_per_gpu is not None for p in by_tp[4])
