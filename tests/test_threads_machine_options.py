"""--threads names its real bound, `pplan calibrate --machine` checks every option before it
measures, and it writes the machine file `pplan run` reads ($PPLAN_MACHINE first). Nothing is
measured: the bench is replaced by one that records the rank counts it was asked for."""

from __future__ import annotations

import pytest

from planner.errors import PplanError
from planner.machine import (configured_machine_path, default_machine_path, find_machine, load_machines,
                             machine_path)
from planner.profiling import options

from helpers.cli import one_error_line
from helpers.machines import made_up_machine


@pytest.fixture
def two_cores(monkeypatch) -> None:
    """This process may run on 2 cores, whatever the machine running the tests has."""
    monkeypatch.setattr(options, "usable_cores", lambda: 2)


def _refused(result: tuple[int, str, str], *says: str) -> str:
    """The one error line of a refusal, holding each of `says`."""
    line = one_error_line(result[0], result[2])
    assert all(text in line for text in says), line
    return line


# ---- the message of a thread count above the bound ----

@pytest.mark.parametrize("cores", [1, 2, 3])
def test_too_many_threads_names_one_bound_in_message_and_hint(monkeypatch, cores):
    monkeypatch.setattr(options, "usable_cores", lambda: cores)
    most = options.THREADS_PER_CORE * cores
    options.check_threads(most)  # the bound itself is allowed
    with pytest.raises(PplanError) as e:
        options.check_threads(most + 1)
    assert f"--threads {most + 1} is more than {most}," in e.value.message
    assert f"for the {cores} core(s) this process may run on (its CPU affinity)" in e.value.message
    assert e.value.hint.startswith(f"give at most {most}:") and "contend" in e.value.hint
    # the old hint said "give at most <cores>", below the bound the message named
    assert f"at most {cores};" not in e.value.hint


def test_the_lower_bound_depends_on_what_zero_means(two_cores):
    with pytest.raises(PplanError, match="--threads 0 must be at least 1"):
        options.check_threads(0)
    options.check_threads(0, zero="0: cores / ranks")
    with pytest.raises(PplanError, match="--threads -1 must be 0 or more") as e:
        options.check_threads(-1, zero="0: cores / ranks")
    assert e.value.hint == "0: cores / ranks"


# ---- calibrate --machine checks its options before measuring ----

@pytest.mark.parametrize("threads, says", [
    ("9", ["--threads 9 is more than 8,", "give at most 8:"]),
    ("-1", ["--threads -1 must be 0 or more", "0: cores / ranks"]),
])
def test_calibrate_machine_refuses_threads_before_measuring(tmp_path, pplan, two_cores, machine_bench, threads, says):
    target = tmp_path / "machine.json"
    err = _refused(pplan("calibrate", "--machine", "--ranks", "2", "--threads", threads, "--out", target), *says)
    assert "ranks (1 of" not in err and machine_bench == [] and not target.exists()


def test_calibrate_machine_takes_threads_within_the_bound(tmp_path, pplan, two_cores, machine_bench):
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--threads", "8", "--out", tmp_path / "m.json")
    assert code == 0 and machine_bench == [2], err


# ---- one machine file for calibrate --machine and run ----

def test_configured_machine_path_is_pplan_machine_else_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PPLAN_MACHINE", raising=False)
    assert configured_machine_path() == default_machine_path() == tmp_path / "cache" / "pplan" / "machine.json"
    monkeypatch.setenv("PPLAN_MACHINE", str(tmp_path / "mine.json"))
    assert configured_machine_path() == tmp_path / "mine.json"
    for off in ("off", "OFF", "none", "0"):
        monkeypatch.setenv("PPLAN_MACHINE", off)
        assert configured_machine_path() is None and machine_path() is None


def test_run_reads_where_configured_machine_path_points(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PPLAN_MACHINE", raising=False)
    assert machine_path() is None  # nothing at the default location: no machine file applies
    default_machine_path().parent.mkdir(parents=True)
    default_machine_path().write_text("{}")
    assert machine_path() == configured_machine_path()
    monkeypatch.setenv("PPLAN_MACHINE", str(tmp_path / "missing.json"))
    assert machine_path() == configured_machine_path() == tmp_path / "missing.json"  # set on purpose: read
    assert machine_path(tmp_path / "given.json") == tmp_path / "given.json"  # --machine-file wins


def test_calibrate_machine_writes_the_file_run_reads(tmp_path, monkeypatch, pplan, machine_bench):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mine = tmp_path / "mine.json"
    monkeypatch.setenv("PPLAN_MACHINE", str(mine))
    code, out, err = pplan("calibrate", "--machine", "--ranks", "2")
    assert code == 0 and f"wrote {mine}" in out, err
    assert load_machines(mine).ranks == (2,) and not default_machine_path().exists()
    assert find_machine(ranks=2) == made_up_machine(2)  # what `pplan run` predicts with
    monkeypatch.delenv("PPLAN_MACHINE")
    code, out, err = pplan("calibrate", "--machine", "--ranks", "4")
    assert code == 0 and f"wrote {default_machine_path()}" in out, err
    assert find_machine(ranks=4) == made_up_machine(4)


def test_calibrate_machine_refuses_to_write_when_pplan_machine_is_off(tmp_path, monkeypatch, pplan, machine_bench):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PPLAN_MACHINE", "off")
    _refused(pplan("calibrate", "--machine", "--ranks", "2"),
             "PPLAN_MACHINE='off' turns the machine file off", "give --out FILE.json")
    assert machine_bench == [] and not default_machine_path().exists()
    code, _, err = pplan("calibrate", "--machine", "--ranks", "2", "--out", tmp_path / "m.json")
    assert code == 0 and machine_bench == [2] and (tmp_path / "m.json").is_file(), err


def test_calibrate_help_names_pplanmade_up_machine(pplan):
    code, out, _ = pplan("calibrate", "--help")
    assert code == 0 and "$PPLAN_MACHINE" in out and "pplan run" in out
