"""Every rank of a torchrun job trains the same plan with the same settings
(planner.execute.job_agreement), and a rank's failure reaches every other rank at once through
torchrun's agent store (planner.execute.job_watch). The torchrun jobs themselves are in
test_torchrun_nodes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from helpers.cli import REPO, cli_env
from planner.errors import PplanError, RunError
from planner.execute.job_agreement import first_disagreement, job_terms
from planner.execute.job_watch import agent_store_address, failures_shared


def _cfg(**change):
    plan = {"model": "gpt:layers=2", "stages": [[0, 2], [2, 4]], "n_microbatches": 4}
    plan.update(change.pop("plan", {}))
    options = {"steps": 10, "warmup": 2, "lr": 1e-3, "calibrate": False, "prefer_torch": True, "timeout_s": 300.0,
               "threads": 0, "verbose": False}
    options.update(change.pop("options", {}))
    cfg = {"plan": plan, "options": options, "device_type": "cpu", "model_kwargs": {"input_dtype": "long"}}
    cfg.update(change)
    return cfg


def test_the_same_config_on_every_rank_agrees():
    assert first_disagreement([job_terms(_cfg(), r, host=f"node{r}") for r in range(4)]) is None


def test_each_ranks_own_timeout_threads_and_verbosity_may_differ():
    other = _cfg(options={"timeout_s": 900.0, "threads": 4, "verbose": True})
    assert first_disagreement([job_terms(_cfg(), 0, "a"), job_terms(other, 1, "b")]) is None


def test_another_plan_names_the_rank_its_host_and_the_plans_part_that_differs():
    terms = [job_terms(_cfg(), 0, "a"), job_terms(_cfg(), 1, "a"),
             job_terms(_cfg(plan={"stages": [[0, 1], [1, 4]]}), 2, "b"), job_terms(_cfg(plan={"n_microbatches": 8}), 3, "b")]
    refusal = first_disagreement(terms)
    assert isinstance(refusal, PplanError)
    line = refusal.one_line()
    assert line.startswith("rank 2 on b (and 1 more rank(s)) and rank 0 on a were given different plans: "
                           "they differ in 'stages' (plan sha256 "), line
    assert "same plan file" in line


def test_another_step_count_or_resume_point_is_named_with_both_values():
    steps = first_disagreement([job_terms(_cfg(), 0, "a"), job_terms(_cfg(options={"steps": 20}), 1, "b")])
    assert "different settings: --steps 20 vs 10" in steps.one_line()
    resumed = first_disagreement([job_terms(_cfg(resume={"step": 4}), 0, "a"), job_terms(_cfg(resume={"step": 8}), 1, "b")])
    assert "the step resumed from (--checkpoint-dir) 8 vs 4" in resumed.one_line()


def test_no_agent_store_outside_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert agent_store_address() is None
    with failures_shared(0):  # nothing to share through: the body runs as it would
        pass


@pytest.fixture
def agent_store(monkeypatch):
    """A store where torchrun's agent keeps one, with the variables torchrun sets for its ranks."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    for name, value in (("TORCHELASTIC_USE_AGENT_STORE", "True"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(store.port)), ("TORCHELASTIC_RUN_ID", "t1"),
                        ("TORCHELASTIC_RESTART_COUNT", "0")):
        monkeypatch.setenv(name, value)
    return store


def test_a_failing_rank_posts_its_reason_first_come_first_kept(agent_store):
    with pytest.raises(PplanError), failures_shared(3):
        raise PplanError("plan 'x.json' does not exist", "make one")
    # a peer's echo of the first failure (its connection closed) leaves with the cause instead
    with pytest.raises(PplanError) as echo, failures_shared(5):
        raise RunError("rank 5 lost its connection to rank 3")
    assert echo.value.one_line().endswith(" stopped the job: plan 'x.json' does not exist; make one")
    assert echo.value.one_line().startswith("rank 3 on ") and echo.value.exit_code == 2
    assert agent_store.add("pplan/t1/0/failed", 0) == 2
    reason = json.loads(agent_store.get("pplan/t1/0/reason"))
    assert reason["rank"] == 3 and reason["exit_code"] == 2
    assert reason["message"] == "plan 'x.json' does not exist; make one"


def test_a_ranks_own_verdict_stands_even_after_a_peers(agent_store):
    """Every rank refuses a disagreement the same way: each prints its own line."""
    with pytest.raises(PplanError), failures_shared(0):
        raise PplanError("ranks 1 and 0 were given different plans")
    with pytest.raises(PplanError, match="^ranks 1 and 0 were given different plans$"), failures_shared(1):
        raise PplanError("ranks 1 and 0 were given different plans")


def test_an_unexpected_error_says_its_root_cause(agent_store):
    with pytest.raises(RuntimeError), failures_shared(2):
        try:
            raise ValueError("injected")
        except ValueError as inner:
            raise RuntimeError("[Stage 1] failed to run forward") from inner
    reason = json.loads(agent_store.get("pplan/t1/0/reason"))
    assert reason["message"] == "RuntimeError: [Stage 1] failed to run forward (caused by ValueError: injected)"
    assert reason["exit_code"] == 1


def test_a_restarted_job_does_not_read_its_previous_attempts_reason(agent_store, monkeypatch):
    with pytest.raises(PplanError), failures_shared(1):
        raise PplanError("first attempt")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert agent_store_address()[2] == "pplan/t1/1"
    assert agent_store.add("pplan/t1/1/failed", 0) == 0


_WAITING_RANK = """
import sys, time
from planner.execute.job_watch import failures_shared
with failures_shared(1):
    print("waiting", flush=True)
    time.sleep(120)  # as a rank inside a collective would
print("not stopped", flush=True)
"""


def test_the_other_ranks_leave_with_the_posted_reason_and_its_exit_code(agent_store):
    proc = subprocess.Popen([sys.executable, "-c", _WAITING_RANK], cwd=REPO, env=cli_env(**{
        k: v for k, v in os.environ.items() if k.startswith(("TORCHELASTIC_", "MASTER_"))}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        with pytest.raises(PplanError), failures_shared(0):
            raise PplanError("the plan needs 4 processes", "start 4")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and "not stopped" not in out
    assert err.strip().splitlines()[-1].startswith("pplan: error: rank 0 on "), err
    assert err.strip().endswith("stopped the job: the plan needs 4 processes; start 4"), err


def test_a_rank_leaves_when_node_0s_store_goes_away_mid_run(monkeypatch):
    """Node 0's torchrun keeps the store and ends soon after a rank there fails: a rank still
    working elsewhere leaves, saying so, instead of waiting out --timeout."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    env = cli_env(TORCHELASTIC_USE_AGENT_STORE="True", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                  TORCHELASTIC_RUN_ID="t2", TORCHELASTIC_RESTART_COUNT="0")
    proc = subprocess.Popen([sys.executable, "-c", _WAITING_RANK], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        del store  # the server closes with its last reference
        import gc

        gc.collect()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "not stopped" not in out
    assert "pplan: error: the job's store at MASTER_ADDR:MASTER_PORT went away while this rank was still working" in err
