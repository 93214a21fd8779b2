"""A symlink loop given to `pplan report` or `pplan calibrate`: one line naming the input, exit 2.

Path.resolve() raised RuntimeError on a loop (Python 3.11) where report compared its inputs with
its output folder and calibrate asked whether a profile was the committed reference one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "mlp.csv"


@pytest.fixture
def loop(symlink_loop: Path) -> Path:
    """The looping input (conftest.symlink_loop)."""
    return symlink_loop


@pytest.fixture
def plan(pplan, tmp_path: Path) -> Path:
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", PROFILE, "-n", "2", "--global-batch", "8", "-o", out)
    assert code == 0, err
    return out


def _one_line_error(code: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "loopa" in lines[0] and "symbolic links" in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--run", "--sim", "--timeline", "--measured-timeline", "--profile"])
def test_report_of_a_looping_input(pplan, plan: Path, loop: Path, tmp_path: Path, flag: str) -> None:
    out = tmp_path / "report"
    code, _, err = pplan("report", "--plan", plan, flag, loop, "--out", out, "--no-simulate")
    _one_line_error(code, err)
    assert not (out / "report.md").exists()


@pytest.mark.parametrize("flag", ["--from-run", "--profile"])
def test_calibrate_from_a_looping_input(pplan, plan: Path, loop: Path, tmp_path: Path, flag: str) -> None:
    args = ("calibrate", plan, flag, loop) if flag == "--from-run" else ("calibrate", plan, "--from-run", loop, flag, loop)
    code, _, err = pplan(*args)
    _one_line_error(code, err)
