"""Outputs are checked before work starts; odd inputs end in one line, never a traceback.

Every command's output path that cannot be written (here: a path below a regular file, which
stops root too, unlike chmod) is refused with exit code 2 and one line before anything is
measured, searched or simulated, and no file is left. Sizes beyond what the machine or the
simulator can hold are refused before they are allocated; stray torchrun variables in the
environment of a plain `pplan run` are refused before any rank starts; a diverging run ends
with one line and still writes its run JSON (non-finite losses as null).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.cli import run_pplan

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _one_line_error(got: subprocess.CompletedProcess, code: int = 2) -> str:
    err = got.stderr.strip()
    assert got.returncode == code, f"exit {got.returncode}, expected {code}\nstderr:\n{got.stderr}"
    assert "Traceback" not in got.stderr, got.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pplan: error:"), got.stderr
    return lines[0]


@pytest.fixture()
def work(sim_work: Path) -> Path:
    (sim_work / "afile").write_text("a regular file, not a folder\n")
    return sim_work


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---- 1. every output is checked before work starts ---------------------------------------------

@pytest.mark.parametrize("case", ["partition", "simulate-out", "simulate-timeline", "simulate-plot", "report",
                                  "profile", "bench", "demo"])
def test_unwritable_output_is_refused_before_any_work(work: Path, case: str) -> None:
    bad = work / "afile"
    args = {
        "partition": ["partition", "sim_profile.csv", "--devices", "2", "--global-batch", "8",
                      "--out", str(bad / "plan.json")],
        "simulate-out": ["simulate", "plan.json", "--out", str(bad / "sim.json")],
        "simulate-timeline": ["simulate", "plan.json", "--timeline", str(bad / "t.csv")],
        "simulate-plot": ["simulate", "plan.json", "--plot", str(bad / "g.png")],
        "report": ["report", "--profile", "sim_profile.csv", "--plan", "plan.json", "--out", str(bad / "r")],
        "profile": ["profile", "-m", "synthetic:layers=2,fwd_ms=50,bwd_ms=50", "-b", "1", "--repeats", "1",
                    "--warmup", "0", "-o", str(bad / "p.csv")],
        "bench": ["bench", "simulator", "--sizes", "4x8", "--repeat", "1", "--out-dir", str(bad / "b")],
        "demo": ["demo", "--quick", "--out-dir", str(bad / "demo")],
    }[case]
    before = _files(work)
    line = _one_line_error(run_pplan(*args, cwd=work))
    assert "afile" in line and ("not a folder" in line or "not writable" in line), line
    assert _files(work) == before  # nothing written, no temporary file


# ---- 7. sizes and profiles that used to end in a traceback -------------------------------------

def test_all_zero_profile_is_refused_by_simulate_json(work: Path) -> None:
    lines = (work / "sim_profile.csv").read_text().splitlines()
    header_at = next(i for i, ln in enumerate(lines) if ln.startswith("layer,"))
    header = lines[header_at].split(",")
    zeroed = lines[:header_at + 1]
    for ln in lines[header_at + 1:]:
        cells = ln.split(",")
        zeroed.append(",".join("0" if h.endswith(("_ms", "_bytes")) else c for h, c in zip(header, cells)))
    (work / "zero.csv").write_text("\n".join(zeroed) + "\n")
    got = run_pplan("simulate", "plan.json", "--profile", "zero.csv", "--json", cwd=work)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    assert "fwd_ms = bwd_ms = 0" in json.loads(got.stdout)["error"]  # --json: the error is JSON on stdout


def test_simulate_refuses_millions_of_microbatches_before_allocating(work: Path) -> None:
    plan = json.loads((work / "plan.json").read_text())
    plan["stages"] = [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6]}]
    plan["devices"] = plan["devices"][:2]
    (work / "two.json").write_text(json.dumps(plan))
    # 2 stages x 10,000,000 micro-batches = 40 million actions: tens of GB as a timeline
    line = _one_line_error(run_pplan("simulate", "two.json", "--microbatches", "10000000", "--keep", "micro-batch-size", "--out", str(work / "s.json"),
                                     cwd=work, timeout=120))
    assert "40,000,000 actions" in line and "150,000" in line  # --out keeps the timeline: its bound
    assert not (work / "s.json").exists()


def test_profile_refuses_a_micro_batch_whose_input_cannot_fit(work: Path) -> None:
    out = work / "p.csv"
    line = _one_line_error(run_pplan("profile", "-m", "mlp", "-b", "1,100000000", "-o", str(out),
                                     cwd=work, timeout=120))
    assert "micro-batch size 100000000" in line and "available" in line
    assert not out.exists()


# ---- stray torchrun variables in a plain `pplan run` -------------------------------------------

def _synthetic_plan(folder: Path, lr_model: str | None = None) -> Path:
    plan = {"model": lr_model or "synthetic:layers=2,fwd_ms=5,bwd_ms=5,param_bytes=1000,act_bytes=1000,hidden=8",
            "schedule": "gpipe", "micro_batch_size": 2, "n_microbatches": 2, "devices": 2, "optimizer": "sgd",
            "stages": [{"device": 0, "layers": [0, 1]}, {"device": 1, "layers": [1, 2]}]}
    if lr_model:
        plan["stages"] = [{"device": 0, "layers": [0, 2]}, {"device": 1, "layers": [2, 4]}]
    path = folder / "run_plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("env", [{"RANK": "0"}, {"WORLD_SIZE": "2"}, {"RANK": "1", "WORLD_SIZE": "2"},
                                 {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}],
                         ids=["rank-only", "world-only", "no-master", "rank-out-of-range"])
def test_stray_torchrun_variables_are_refused_before_any_rank_starts(tmp_path: Path, env: dict[str, str]) -> None:
    plan = _synthetic_plan(tmp_path)
    out = tmp_path / "run.json"
    line = _one_line_error(run_pplan("run", str(plan), "--steps", "2", "--warmup", "0", "--device", "cpu", "--timeout", "5", "--out", str(out),
                                     cwd=tmp_path, timeout=120, **env))
    assert next(iter(env)) in line and "torchrun" in line, line
    assert not out.exists()


# ---- 2. a diverging run -----------------------------------------------------------------------

@pytest.mark.slow
def test_diverging_run_ends_with_one_line_and_keeps_the_losses(tmp_path: Path) -> None:
    plan = _synthetic_plan(tmp_path, lr_model="mlp:layers=4,hidden=32,input=16,classes=8")
    out = tmp_path / "run.json"
    got = run_pplan("run", str(plan), "--lr", "1e20", "--steps", "8", "--warmup", "1", "--device", "cpu", "--out", str(out),
                    cwd=tmp_path, timeout=180)
    err = got.stderr
    assert got.returncode == 1, err
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("pplan: error:")]
    assert len(errors) == 1 and "diverged" in errors[0] and "--lr" in errors[0], err
    run = json.loads(out.read_text())  # strict JSON: no NaN/Infinity tokens
    assert run["diverged"]["loss"] in ("inf", "-inf", "nan")
    k = run["diverged"]["step"]
    assert run["loss_steps"][-1] == k and run["losses"][-1] is None  # the non-finite loss is null
    assert all(isinstance(x, float) for x in run["losses"][:-1])  # the finite ones before it are kept
    assert len(run["step_ms"]) == k + 1 < 8  # the run stopped after the diverged step
