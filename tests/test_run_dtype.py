"""`pplan run` trains in the dtype its profile was measured in (`# dtype:`).

A `--dtype bfloat16` profile plans bf16 weights and gradients (2 bytes a parameter each; Adam steps
fp32 master copies, planner.master_weights and planner.cost.optimizer_factor), but the run used to
build the model in float32 and compare the two without saying so (Qwen2 tiny:
weights 2,207,744 B measured against 1,103,872 B predicted, peaks +91% / +77%). The profile's
dtype now travels with build_model's arguments (preflight.model_kwargs), which cast the model and
the batches' floating tensors as `pplan profile --dtype` does; a float16 profile is refused (pure
float16 training without loss scaling is not the training the plan stands for).
"""

from __future__ import annotations

import math

import pytest
import torch

from planner.errors import ProfileError
from planner.execute import RunOptions
from planner.execute.preflight import preflight, run_dtype
from planner.execute.reference import reference_run
from planner.models import build_model
from planner.plan import load_plan

from helpers.plans import write_plan, write_synthetic_profile

CPU = RunOptions(device="cpu", steps=2)


def _plan(tmp_path, dtype: str | None):
    """A 2-device plan of a synthetic model on a profile that records `dtype` (None: no dtype line)."""
    prof = tmp_path / "syn.csv"
    spec = write_synthetic_profile(prof, 4, 2, fwd_ms=0.0, bwd_ms=0.0)  # no sleeping: the test trains it
    if dtype is not None:
        lines = prof.read_text().splitlines(keepends=True)
        prof.write_text(lines[0] + f"# dtype: {dtype}\n" + "".join(lines[1:]))
    return load_plan(write_plan(tmp_path / "p.json", spec, "1f1b", 2, [(0, 2), (2, 4)], profile=prof))


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_a_float32_profile_builds_the_model_as_before(tmp_path, dtype):
    pf = preflight(_plan(tmp_path, dtype), CPU)
    assert "dtype" not in pf.model_kwargs and run_dtype(pf.profile) == "float32"


def test_a_bfloat16_profile_trains_in_bfloat16(tmp_path):
    plan = _plan(tmp_path, "bfloat16")
    pf = preflight(plan, CPU)
    assert pf.model_kwargs == {"dtype": "bfloat16"}
    bundle = build_model(plan.model, seed=plan.seed, **pf.model_kwargs)
    assert {p.dtype for p in bundle.layers.parameters()} == {torch.bfloat16}
    x, y = bundle.make_batch(4, 0)
    assert x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16  # the synthetic model's float input and target
    float32 = build_model(plan.model, seed=plan.seed)
    assert sum(p.numel() * p.element_size() for p in bundle.layers.parameters()) * 2 == \
        sum(p.numel() * p.element_size() for p in float32.layers.parameters())  # the bytes the profile priced
    # the training loop, single-process: the weights stay bfloat16 (Adam steps their fp32 masters)
    losses, state = reference_run(plan, 2, model_kwargs=pf.model_kwargs)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert {t.dtype for s in state.values() for t in s.values() if t.is_floating_point()} == {torch.bfloat16}


def test_integer_inputs_stay_integers(tmp_path):
    bundle = build_model("mlp:layers=2,hidden=8,input=4", seed=0, dtype="bfloat16")
    x, y = bundle.make_batch(3, 0)
    assert x.dtype == torch.bfloat16 and y.dtype == torch.int64  # class labels are not cast


def test_a_float16_profile_is_refused_in_one_line(tmp_path):
    plan = _plan(tmp_path, "float16")
    with pytest.raises(ProfileError, match=r"measured in float16, which pplan run cannot train in: .*without loss "
                                           r"scaling .*; re-profile with --dtype bfloat16 .* or float32, and re-plan"):
        preflight(plan, CPU)
