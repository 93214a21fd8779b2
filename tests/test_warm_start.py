"""Ranks forked from the warm-start server are processes like fresh ones (planner/warm_start.py).

Each check runs twice, warm and with PPLAN_WARM_START=0 (a fresh `python -c`), and both must
agree: the arguments, environment, working directory, import path, session and name a process
gets, its pipes, and how its exit (a code, SystemExit text, an exception, a signal) is reported.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner.warm_start import WarmStarter, start_rank_process, warm_start_enabled

TESTS = Path(__file__).resolve().parent


@pytest.fixture(params=["warm", "fresh"])
def mode(request, monkeypatch) -> str:
    monkeypatch.setenv("PPLAN_WARM_START", "1" if request.param == "warm" else "0")
    if request.param == "warm" and not warm_start_enabled():
        pytest.skip("warm start needs Linux")
    return request.param


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return dict(env, PYTHONPATH=os.pathsep.join([str(tmp_path / "extra"), str(TESTS)]), **extra)


def test_a_started_process_gets_its_arguments_environment_directory_and_name(mode, tmp_path):
    (tmp_path / "extra").mkdir()
    p = start_rank_process("helpers.warm_targets:describe", ["a", "b c"], _env(tmp_path, ONLY_HERE="x=1"),
                           name="pplan-rank7", cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.stdout.read(), p.stderr.read()
    assert p.wait(timeout=120) == 2, err
    seen = json.loads(out)
    assert seen["args"] == ["a", "b c"] and seen["argv"] == ["a", "b c"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"]["ONLY_HERE"] == "x=1" and "PPLAN_WARM_START" in seen["env"]
    # as `python -c` has it: the working directory first, then PYTHONPATH in order
    assert seen["path_head"][0] == "" and seen["path_head"][1:] == [str(tmp_path / "extra"), str(TESTS)]
    assert seen["sid_is_pid"], "a rank runs in its own session (Ctrl-C reaches only the launcher)"
    assert seen["name"] == "pplan-rank7"
    assert (seen["ppid"] == os.getpid()) == (mode == "fresh"), "warm: forked by the server, not by this process"
    assert err == b"to stderr\n"


def test_stderr_can_join_stdout_or_go_to_a_file_and_stdin_is_a_pipe(mode, tmp_path):
    p = start_rank_process("helpers.warm_targets:describe", [], _env(tmp_path), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    assert p.stdout.read().endswith(b"}to stderr\n") and p.wait(timeout=120) == 0
    with open(tmp_path / "log", "wb") as log:
        p = start_rank_process("helpers.warm_targets:describe", [], _env(tmp_path), stdout=log, stderr=log)
    assert p.wait(timeout=120) == 0
    assert (tmp_path / "log").read_bytes().endswith(b"to stderr\n")
    p = start_rank_process("helpers.warm_targets:echo_stdin", [], _env(tmp_path), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    p.stdin.write("one\ntwo\n")
    p.stdin.close()
    assert p.stdout.read() == "ONE\nTWO\n" and p.wait(timeout=120) == 0


@pytest.mark.parametrize("how, code, said", [("code", 7, ""), ("text", 1, "stopped: no input"),
                                             ("raise", 1, "ValueError: a rank's own error"),
                                             ("signal", -signal.SIGUSR1, "")])
def test_every_way_of_ending_is_reported_as_a_fresh_process_reports_it(mode, tmp_path, how, code, said):
    p = start_rank_process("helpers.warm_targets:exit_with", [how], _env(tmp_path), stderr=subprocess.PIPE)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == code, err
    assert said in err
    assert ("Traceback" in err) == (how == "raise")


def test_a_running_process_can_be_polled_waited_for_and_terminated(mode, tmp_path):
    p = start_rank_process("helpers.warm_targets:sleep_forever", [], _env(tmp_path), stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"sleeping\n"
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    p.terminate()
    assert p.wait(timeout=60) == -signal.SIGTERM
    assert p.poll() == -signal.SIGTERM
    p.kill()  # after the end: nothing to signal, no error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm start needs Linux")
def test_the_server_goes_when_its_launcher_lets_go_and_takes_its_orphans_status_with_it(tmp_path):
    starter = WarmStarter()
    p = starter.start("helpers.warm_targets:sleep_forever", [], _env(tmp_path), stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"sleeping\n"
    server = starter._proc
    os.kill(server.pid, signal.SIGKILL)  # the server dies first: the child is taken down and reported killed
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert p.stdout.read() == b""  # no process holds the child's stdout any more
    q = starter.start("helpers.warm_targets:describe", [], _env(tmp_path), stdout=subprocess.DEVNULL)
    assert q.wait(timeout=120) == 0, "a dead server is replaced on the next start"
    fresh = starter._proc
    assert fresh is not server
    starter.close()
    assert fresh.poll() is not None, "closing the starter ends its server"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm start needs Linux")
def test_a_server_that_hung_up_but_has_not_exited_yet_is_replaced(tmp_path):
    """A killed server closes its sockets before its exit status exists: in that moment poll() says
    it runs, and the next start once went to it and failed ("exited before starting a process"),
    under load, in the test above. Here the moment is held open: a process still running whose end
    of the control socket is closed."""
    starter = WarmStarter()
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    starter._proc, starter._control = dying, ours
    try:
        q = starter.start("helpers.warm_targets:describe", [], _env(tmp_path), stdout=subprocess.DEVNULL)
        assert q.wait(timeout=120) == 0
        assert starter._proc is not dying and dying.returncode is not None  # replaced, and its exit collected
    finally:
        starter.close()


def test_a_process_whose_environment_is_too_large_for_the_server_starts_fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("PPLAN_WARM_START", "1")
    if not warm_start_enabled():
        pytest.skip("warm start needs Linux")
    p = start_rank_process("helpers.warm_targets:describe", [], _env(tmp_path, HUGE="x" * 70_000), stdout=subprocess.PIPE)
    seen = json.loads(p.stdout.read())
    assert p.wait(timeout=120) == 0
    assert len(seen["env"]["HUGE"]) == 70_000
    assert isinstance(p, subprocess.Popen) and seen["ppid"] == os.getpid(), "started fresh, by this process"


@pytest.mark.slow
def test_a_run_trains_bit_for_bit_alike_with_warm_and_fresh_ranks(tmp_path, monkeypatch):
    """The same plan, seed and threads: the same losses and final weights either way."""
    import torch

    from planner.execute import RunOptions
    from planner.execute.checkpoint import latest_checkpoint, load_rank_file
    from planner.execute.run import run_plan
    from planner.plan import load_plan

    from helpers.equivalence import EQUIVALENCE_THREADS
    from helpers.plans import write_plan

    path = write_plan(tmp_path / "plan.json", "mlp:layers=4,hidden=32,input=16,classes=8", "1f1b", 2, [(0, 2), (2, 4)],
                      micro_batch_size=2, n_microbatches=4, seed=5)
    plan = load_plan(path)
    runs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("PPLAN_WARM_START", switch)
        ck = tmp_path / f"ck{switch}"
        opts = RunOptions(steps=2, warmup=1, device="cpu", lr=1e-2, threads=EQUIVALENCE_THREADS, checkpoint_dir=str(ck))
        losses = run_plan(plan, opts, plan_path=str(path)).record.to_dict()["losses"]
        _, folder = latest_checkpoint(ck, plan)
        weights = {}
        for r in range(2):
            weights.update(load_rank_file(folder, r)["layers"])
        runs[switch] = losses, weights
    (warm_losses, warm), (fresh_losses, fresh) = runs["1"], runs["0"]
    assert warm_losses == fresh_losses and len(warm_losses) == 2
    assert sorted(warm) == sorted(fresh) == [0, 1, 2, 3]
    for i in warm:
        for name, t in warm[i].items():
            torch.testing.assert_close(t, fresh[i][name], rtol=0, atol=0)
