"""`pplan run` under torchrun across nodes, two "nodes" of one process each on this machine
(static rendezvous on loopback, each node with its own command line, as on a cluster): a node
given another plan or other options is refused on every node; a node that refuses its command
stops the others at once with its reason; a rank other than 0 does not check outputs it never
writes. Multi-process, so slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import REPO, cli_env
from helpers.plans import write_plan

pytestmark = pytest.mark.slow

GPT = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=128,ffn=2"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _plan(path: Path, cut: int) -> Path:
    return write_plan(path, GPT, "1f1b", 2, [(0, cut), (cut, 4)], micro_batch_size=2, n_microbatches=4, seed=3)


def _two_nodes(node0: list[str], node1: list[str]) -> list[subprocess.CompletedProcess]:
    """Each node's `pplan run` arguments, run as torchrun node 0 and node 1 of one job. --timeout
    120: a node that ends before the test's own limit was stopped by its peer, not by a timeout."""
    from planner.execute.launch import free_port

    port = str(free_port())
    env = cli_env(OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                               "--master-addr", "127.0.0.1", "--master-port", port, "-m", "cli.app", "run",
                               *args, "--steps", "2", "--timeout", "120"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for rank, args in enumerate((node0, node1))]
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=100)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    return done


def _pplan_lines(res: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("pplan: error:")]


def test_nodes_given_different_plans_are_refused_on_every_node(tmp_path):
    a, b = _plan(tmp_path / "a.json", 2), _plan(tmp_path / "b.json", 1)
    runs = _two_nodes([str(a), "--out", str(tmp_path / "run.json")], [str(b)])
    for res in runs:
        assert res.returncode != 0 and "exitcode  : 2" in res.stderr, res.stderr[-3000:]
        # each rank's own line, or (if its watcher read the peer's post first) the peer's, relayed
        line, = _pplan_lines(res)
        assert "rank 1 on " in line and "were given different plans: they differ in 'stages'" in line
        assert "planner/execute" not in res.stderr  # no traceback through pplan's code
    assert not (tmp_path / "run.json").exists()


def test_nodes_given_different_steps_are_refused_on_every_node(tmp_path):
    a = _plan(tmp_path / "a.json", 2)
    for res in _two_nodes([str(a)], [str(a), "--lr", "0.01"]):
        line, = _pplan_lines(res)
        assert "run the plan with different settings: --lr 0.01 vs 0.001" in line, res.stderr[-3000:]


def test_a_node_that_refuses_its_command_stops_the_other_with_its_reason(tmp_path):
    a = _plan(tmp_path / "a.json", 2)
    node0, node1 = _two_nodes([str(a)], [str(tmp_path / "missing.json")])
    line1, = _pplan_lines(node1)
    assert "missing.json' does not exist" in line1
    line0, = _pplan_lines(node0)  # not a join timeout after --timeout 120 s: the reason, from node 1
    assert line0.startswith("pplan: error: rank 1 on ") and "stopped the job: plan '" in line0, node0.stderr[-3000:]
    assert "missing.json' does not exist" in line0 and "exitcode  : 2" in node0.stderr


def test_only_rank_0_checks_and_writes_the_outputs(tmp_path):
    """Every node typed the same command: node 1's --out would not be writable there, and it
    writes none; rank 0 writes the run and prints the summary."""
    a = _plan(tmp_path / "a.json", 2)
    unwritable = tmp_path / "no-such-dir" / "run.json"
    node0, node1 = _two_nodes([str(a), "--out", str(tmp_path / "run.json")], [str(a), "--out", str(unwritable)])
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr[-2000:] + node1.stderr[-2000:]
    assert (tmp_path / "run.json").is_file() and not unwritable.parent.exists()
    assert "ran " in node0.stdout and "ran " not in node1.stdout
    # the step lines come from the rank holding the last stage of replica 0: node 1's here
    assert "step 2/2" in node1.stdout + node1.stderr


def test_a_rank_that_fails_mid_run_stops_the_other_node_with_its_reason(tmp_path):
    """Rank 1 fails after both joined, while rank 0 waits on it inside the schedule (C code,
    where no Python runs): rank 0 leaves with rank 1's reason, not after --timeout 120 s."""
    plan = write_plan(tmp_path / "f.json", "failing_rank_model:build", "1f1b", 2, [(0, 2), (2, 4)],
                      micro_batch_size=2, n_microbatches=2, seed=1)
    node0, node1 = _two_nodes([str(plan), "--trust-model"], [str(plan), "--trust-model"])
    assert "injected failure on rank 1" in node1.stderr, node1.stderr[-3000:]
    line0, = _pplan_lines(node0)
    assert line0.startswith("pplan: error: rank 1 on ") and "stopped the job: RuntimeError: " in line0 \
        and "(caused by RuntimeError: injected failure on rank 1)" in line0, node0.stderr[-3000:]
    assert node0.returncode != 0 and "exitcode  : 1" in node0.stderr


def test_your_own_loop_refuses_another_plan_on_another_node(tmp_path):
    """examples/train_with_plan.py on each machine with its own plan file: build_pipeline
    compares the plans of every rank before building anything."""
    from planner.execute.launch import free_port

    a, b = _plan(tmp_path / "a.json", 2), _plan(tmp_path / "b.json", 1)
    port, env = str(free_port()), cli_env(OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                               "--master-addr", "127.0.0.1", "--master-port", port,
                               str(REPO / "examples" / "train_with_plan.py"), str(plan), "--steps", "2",
                               "--out", str(tmp_path / f"losses{rank}.json")],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, plan in enumerate((a, b))]
    try:
        results = [p.communicate(timeout=100) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, results):
        assert p.returncode != 0, out + err[-2000:]
        assert "rank 1 was given another plan than rank 0 (plan sha256 " in err, err[-3000:]
    assert not list(tmp_path.glob("losses*.json"))
