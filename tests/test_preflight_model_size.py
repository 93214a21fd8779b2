"""`pplan run` sizes a plan's model before any rank starts, built-ins as well as hf: models.

The bound is lowered (planner.models.bounds.usable_memory_bytes patched) for the library test;
the command-line test names a model far above any machine's memory, which the old code's ranks
refused only after launch, each on its own.
"""

from __future__ import annotations

import pytest

from planner.errors import ModelSpecError
from planner.execute import RunOptions
from planner.execute.preflight import preflight
from planner.models import bounds
from planner.plan import load_plan

from helpers.plans import write_plan

HUGE = "mlp:layers=3,hidden=10000000"  # the 10^7 x 10^7 weights between its hidden layers alone: 364 TiB


def test_preflight_refuses_a_builtin_above_the_bound(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path / "p.json", "mlp:layers=2,hidden=20000", "1f1b", 2, [(0, 1), (1, 2)]))
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: 2**30)  # 20000 x (784 + 10) weights: 60.6 MiB
    assert preflight(plan, RunOptions(device="cpu")).n_layers == 2
    monkeypatch.setattr(bounds, "usable_memory_bytes", lambda: 2**20)
    with pytest.raises(ModelSpecError, match=r"^model 'mlp:layers=2,hidden=20000' needs at least 60\.\d MiB .*above pplan's "
                                             r"bound of 1\.0 MiB.*shrink hidden, layers, input or classes"):
        preflight(plan, RunOptions(device="cpu"))


def test_run_refuses_a_huge_builtin_before_any_rank_starts(tmp_path, pplan):
    path = write_plan(tmp_path / "p.json", HUGE, "1f1b", 2, [(0, 2), (2, 3)])
    out = tmp_path / "run.json"
    code, stdout, stderr = pplan("run", path, "--steps", "1", "--device", "cpu", "-o", out)
    assert code == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("pplan: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"pplan: error: model '{HUGE}' needs at least"), stderr
    assert "rank 0 failed" not in stderr and "Traceback" not in stderr and not out.exists()
