"""`pplan run` refuses a plan whose model is not the one its profile measured (`# model:`).

A plan edited to name an mlp of width 64, with the layer count of the width-2048 mlp its
profile measured, used to train the small model against the large one's cuts and predictions
and exit 0 ("error +157.5%"). The same model written otherwise (keys reordered, defaults spelled
out) still runs.
"""

from __future__ import annotations

import pytest

from planner.errors import PlanError
from planner.execute import RunOptions
from planner.execute.preflight import preflight, same_model
from planner.plan import load_plan

from helpers.plans import write_plan, write_synthetic_profile

CPU = RunOptions(device="cpu", steps=2)


def _plan_on_profile(tmp_path, model: str):
    prof = tmp_path / "syn.csv"
    write_synthetic_profile(prof, 4, 2)  # records synthetic:layers=4,fwd_ms=10,...
    return load_plan(write_plan(tmp_path / "p.json", model, "1f1b", 2, [(0, 2), (2, 4)], profile=prof))


def test_a_plan_naming_another_model_of_the_same_layer_count_is_refused(tmp_path):
    plan = _plan_on_profile(tmp_path, "synthetic:layers=4,fwd_ms=1,bwd_ms=20,param_bytes=4096,act_bytes=1000,hidden=16")
    with pytest.raises(PlanError, match=r"plan's model 'synthetic:layers=4,fwd_ms=1,.*' is not the model "
                                        r"'synthetic:layers=4,fwd_ms=10,.*' that its profile '.*syn.csv' measured.*; "
                                        r"re-profile this model .* and re-partition"):
        preflight(plan, CPU)


def test_a_profile_given_with_profile_of_another_model_is_refused(tmp_path):
    plan = _plan_on_profile(tmp_path, "synthetic:layers=4,fwd_ms=10,bwd_ms=20,param_bytes=4096,act_bytes=1000,hidden=16")
    other = tmp_path / "other.csv"
    write_synthetic_profile(other, 4, 2, hidden=32)
    with pytest.raises(PlanError, match="hidden=32' that its profile"):
        preflight(plan, CPU, profile_override=str(other))


def test_the_same_model_written_otherwise_runs(tmp_path):
    # keys reordered, 10 written 10.0, spaces: the same model as the profile's
    plan = _plan_on_profile(tmp_path, "synthetic: hidden=16,act_bytes=1000,param_bytes=4096,bwd_ms=20.0,fwd_ms=10,layers=4")
    assert preflight(plan, CPU).n_layers == 4


@pytest.mark.parametrize(("a", "b", "same"), [
    ("gpt", "gpt:layers=12,hidden=256", True),  # the defaults spelled out
    ("mlp:layers=8,hidden=64", "mlp:hidden=64,layers=8", True),
    ("mlp:layers=8,hidden=64", "mlp:layers=8,hidden=2048", False),
    ("pkg.mod:make:width=2,depth=3", "pkg.mod:make:depth=3, width=2", True),
    ("pkg.mod:make:width=2", "pkg.mod:make:width=2.0", True),
    ("pkg.mod:make:flag=true", "pkg.mod:make:flag=1", False),  # a factory may tell True from 1
    ("pkg.mod:make:width=2", "pkg.mod:build:width=2", False),
    ("hf:qwen2:hidden_size=128,vocab_size=2000", "hf:qwen2:vocab_size=2000,hidden_size=128", True),
    ("hf:qwen2:hidden_size=128", "hf:llama:hidden_size=128", False),
    ("not a spec", "not a spec", True),
    ("not a spec", "mlp", False),
])
def test_same_model_compares_parsed_specs(a, b, same):
    assert same_model(a, b) is same and same_model(b, a) is same
