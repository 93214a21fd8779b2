"""`pplan run`'s advice to profile beside the other ranks (`--co-run`): given only when a CPU
run's actions were slower than a profile measured with fewer processes beside it."""

from __future__ import annotations

from types import SimpleNamespace

import planner.execute.run as run_module
from planner.execute.run import CO_RUN_WARN_RATIO, co_run_warnings


def _pf(co_run: str | None = None, device: str = "cpu", analytic: bool = False) -> SimpleNamespace:
    meta = {} if co_run is None else {"co_run": co_run}
    if analytic:
        meta["analytic"] = "true"
    return SimpleNamespace(profile=SimpleNamespace(meta=meta), device_type=device)


RANKS = ["h", "h"]  # each rank's host: two ranks on one machine


def test_slow_actions_beside_other_ranks_suggest_co_run(monkeypatch):
    monkeypatch.setattr(run_module, "usable_cores", lambda: 2)
    (line,) = co_run_warnings(RANKS, _pf(), 1.2)
    assert "1.20x" in line and "--co-run 1" in line and "2 ranks" in line and "beside 0" in line


def test_co_run_advice_fits_this_machines_cores(monkeypatch):
    """4 ranks on a 2-core machine once advised --co-run 3, which `pplan profile` then refused."""
    monkeypatch.setattr(run_module, "usable_cores", lambda: 2)
    (line,) = co_run_warnings(["h"] * 4, _pf(), 1.2)
    assert "re-profile with --co-run 1," in line and "(--co-run 3 needs 4)" in line
    monkeypatch.setattr(run_module, "usable_cores", lambda: 16)
    (line,) = co_run_warnings(["h"] * 4, _pf(), 1.2)
    assert "re-profile with --co-run 3 (" in line


def test_no_advice_when_it_would_not_help_or_was_followed():
    slow = CO_RUN_WARN_RATIO + 0.05
    assert co_run_warnings(RANKS, _pf(), CO_RUN_WARN_RATIO) == []          # not slower than the threshold
    assert co_run_warnings(RANKS, _pf("1"), slow) == []                    # profiled beside one process already
    assert co_run_warnings(RANKS, _pf(device="cuda"), slow) == []          # GPUs do not share memory
    assert co_run_warnings(RANKS, _pf(analytic=True), slow) == []          # nothing was measured
    assert co_run_warnings(["a", "b"], _pf(), slow) == []  # one rank per host
    assert co_run_warnings(RANKS, _pf(), None) == []
    assert co_run_warnings(RANKS, SimpleNamespace(profile=None, device_type="cpu"), slow) == []
