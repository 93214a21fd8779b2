"""A symlink loop given where pplan reads a file: one line naming the file, exit 2, no traceback.

Path.resolve() raises RuntimeError on a loop (Python 3.11): comparing the inputs with the outputs
before reading anything turned `pplan partition PROFILE --cluster loopa` into a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.atomic import ensure_outputs_distinct, resolved_path
from planner.errors import PplanError

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv"


@pytest.fixture
def loop(symlink_loop: Path) -> Path:
    """The looping input (conftest.symlink_loop)."""
    return symlink_loop


def test_outputs_are_compared_with_a_looping_input(loop: Path, tmp_path: Path) -> None:
    ensure_outputs_distinct([("--out", tmp_path / "plan.json")], [("cluster", loop)])  # distinct: nothing raised
    with pytest.raises(PplanError, match="is the cluster this command reads"):
        ensure_outputs_distinct([("--out", loop.parent / "." / loop.name)], [("cluster", loop)])


def test_resolved_path_follows_links_and_stops_at_a_loop(loop: Path, tmp_path: Path) -> None:
    target = tmp_path / "real.csv"
    target.write_text("x\n")
    link = tmp_path / "link.csv"
    os.symlink(target.name, link)
    assert resolved_path(link) == target.resolve()
    assert resolved_path(tmp_path / "sub" / ".." / "loopa") == resolved_path(loop)  # no RuntimeError


def _one_line_error(code: int, err: str, name: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert name in lines[0] and "symbolic links" in lines[0] and "Traceback" not in err


def test_partition_with_a_looping_cluster_file(pplan, loop: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, _, err = pplan("partition", PROFILE, "-n", "2", "--global-batch", "8", "--cluster", loop, "-o", out)
    _one_line_error(code, err, "cluster file")
    assert not out.exists()


def test_partition_and_simulate_of_a_looping_input(pplan, loop: Path, tmp_path: Path) -> None:
    code, _, err = pplan("partition", loop, "-n", "2", "--global-batch", "8", "-o", tmp_path / "plan.json")
    _one_line_error(code, err, "profile")
    code, _, err = pplan("simulate", loop)
    _one_line_error(code, err, "plan")
