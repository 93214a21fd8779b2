"""`pplan partition` on the command line: output, determinism, and one-line errors that write nothing."""

import json
from pathlib import Path

import pytest

from planner.partition.synthetic import gpt_like
from planner.plan import load_plan
from planner.profiling.profile import load_profile, write_profile

from helpers.cli import run_pplan

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster.json"


@pytest.fixture(scope="module")
def profile_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "gpt.csv"
    write_profile(gpt_like(n_blocks=8, hidden=512, seq=256, vocab=32000), path)
    return path


def test_partition_writes_a_plan_and_explains_it(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, _ = pplan("partition", profile_csv, "--devices", 4, "--memory", "4GiB",
                            "--global-batch", 32, "--out", out)
    assert code == 0
    plan = load_plan(out)
    assert plan.n_devices == 4 and plan.global_batch == 32 and plan.profile_path == str(profile_csv)
    assert plan.predicted.iteration_ms > 0 and len(plan.predicted.devices) == 4
    for word in ("stage", "bottleneck", "why", "baselines", "wrote"):
        assert word in stdout


def test_json_output_and_byte_identical_plans(pplan, profile_csv, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["partition", profile_csv, "--devices", 2, "--memory", "3GiB", "--global-batch", 16, "--json"]
    code, stdout, _ = pplan(*args, "--out", a)
    assert code == 0
    data = json.loads(stdout)
    assert data["plan"]["schedule"] == data["summary"]["runners_up"][0]["schedule"]
    assert {"stages", "devices", "baselines", "bottleneck_stage"} <= set(data["summary"])
    assert pplan(*args, "--out", b)[0] == 0
    assert a.read_bytes() == b.read_bytes()


def test_the_library_job_makes_the_commands_plan_and_counts_its_steps(pplan, profile_csv, tmp_path):
    from planner.partition.job import partition_pipeline
    from planner.partition.options import settings_from_options
    from planner.plan import plan_to_json

    out = tmp_path / "plan.json"
    assert pplan("partition", profile_csv, "--devices", 2, "--memory", "3GiB", "--global-batch", 16, "--out", out)[0] == 0
    steps: list[tuple[int, int, str]] = []
    job = partition_pipeline(profile_csv, settings_from_options(devices=2, memory="3GiB", global_batch=16),
                             on_step=lambda done, total, note: steps.append((done, total, note)))
    assert plan_to_json(job.plan) == out.read_text() and not out.with_name("plan.png").exists()
    total = steps[0][1]
    assert total > 1 and [s[0] for s in steps] == list(range(total + 1)) and {s[1] for s in steps} == {total}
    assert all(" M=" in note or note.startswith("polish") for _, _, note in steps[1:])  # its grid point or polish slot
    assert sum(note.startswith("polish") for _, _, note in steps) == 3  # POLISH_TOP slots after the grid
    assert job.calibration is None and job.calibration_path is None and job.basis.startswith("uncalibrated")


def test_partition_imports_neither_torch_nor_matplotlib(profile_csv, tmp_path):
    import subprocess
    import sys

    from helpers.cli import cli_env

    code = (
        "import sys\n"
        "from cli.app import main\n"
        f"sys.argv = ['pplan', 'partition', {str(profile_csv)!r}, '--devices', '2', '--global-batch', '8', "
        f"'--json', '--out', {str(tmp_path / 'plan.json')!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'matplotlib', 'typer.testing') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=cli_env(PPLAN_MACHINE="off"),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout and (tmp_path / "plan.json").exists()


def test_cluster_option(pplan, profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, _ = pplan("partition", profile_csv, "--cluster", CLUSTER, "--global-batch", 16, "--out", out)
    assert code == 0, stdout
    plan = load_plan(out)
    assert {d.name for d in plan.devices} >= {"old-gpu"} and len(plan.links.pairs) == 5


def _bad_cluster(tmp_path, text):
    p = tmp_path / "bad_cluster.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize("case", [
    "tiny_memory", "too_many_devices", "zero_devices", "indivisible", "unknown_schedule", "unknown_method",
    "corrupt_profile", "missing_profile", "cluster_syntax", "cluster_unknown_device", "bad_memory", "bad_microbatches",
    "no_devices",
])
def test_bad_input_is_one_line_exit_2_and_no_file(pplan, profile_csv, tmp_path, case):
    out = tmp_path / "plan.json"
    # indices: 2-3 devices, 4-5 memory, 6-7 batch, 8-9 out
    base = ["partition", profile_csv, "--devices", 4, "--memory", "4GiB", "--global-batch", 32, "--out", out]
    corrupt = tmp_path / "corrupt.csv"
    corrupt.write_text("layer,name,micro_batch_size,fwd_ms\n0,a,1,oops\n")
    args = {
        "tiny_memory": base[:4] + ["--memory", "100MiB"] + base[6:],
        "too_many_devices": base[:2] + ["--devices", 11] + base[4:],
        "zero_devices": base[:2] + ["--devices", 0] + base[4:],
        "indivisible": base + ["--microbatches", 7],
        "unknown_schedule": base + ["--schedule", "pipedream"],
        "unknown_method": base + ["--method", "genetic"],
        "corrupt_profile": ["partition", corrupt] + base[2:],
        "missing_profile": ["partition", tmp_path / "nope.csv"] + base[2:],
        "cluster_syntax": base[:2] + ["--cluster", _bad_cluster(tmp_path, "{'devices': ")] + base[4:],
        "cluster_unknown_device": base[:2] + ["--cluster", _bad_cluster(
            tmp_path, json.dumps({"devices": [{"name": "a"}, {"name": "b"}], "links": [{"a": "a", "b": "z", "bandwidth": "1GB/s"}]}))] + base[4:],
        "bad_memory": base[:4] + ["--memory", "lots"] + base[6:],
        "bad_microbatches": base + ["--microbatches", "many"],
        "no_devices": base[:2] + base[4:],
    }[case]
    code, stdout, stderr = pplan(*args)
    assert code == 2, (stdout, stderr)
    assert "Traceback" not in stderr + stdout
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pplan: error:"), stderr
    assert not out.exists()
    if case == "tiny_memory":
        assert "--memory" in lines[0] and "least memory" in lines[0]


def test_real_entry_point_in_a_subprocess(profile_csv, tmp_path):
    out = tmp_path / "plan.json"
    run = run_pplan("partition", profile_csv, "--devices", "2", "--memory", "50MiB", "--global-batch", "8", "--out", out,
                    timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.startswith("pplan: error: no plan fits")
    assert not out.exists()


def test_calibration_beside_the_profile_is_applied(pplan, tmp_path, tiny_gpt_csv):
    from planner.calibration import Calibration, calibration_path_for, write_calibration

    prof = tiny_gpt_csv
    plain, scaled = tmp_path / "plain.json", tmp_path / "scaled.json"
    args = ["partition", prof, "--devices", 2, "--global-batch", 8, "--microbatches", 4, "--schedule", "gpipe"]
    assert pplan(*args, "--out", plain)[0] == 0
    write_calibration(Calibration(compute_scale=3.0), calibration_path_for(prof))
    assert pplan(*args, "--out", scaled)[0] == 0
    a, b = load_plan(plain), load_plan(scaled)
    assert b.search.calibrated and not a.search.calibrated
    assert b.predicted.iteration_ms > 2.5 * a.predicted.iteration_ms
    from planner.partition.job import partition_pipeline
    from planner.partition.options import settings_from_options

    job = partition_pipeline(prof, settings_from_options(devices=2, memory=None, global_batch=8, microbatches="4",
                                                         schedule="gpipe"))
    assert job.calibration_path == calibration_path_for(prof) and job.plan == b
    assert job.basis == f"calibrated by {calibration_path_for(prof)} (compute x3)"


def test_zb_rows_fit_only_with_a_question_mark_without_wgrad_bytes(pplan, tmp_path):
    """Without a wgrad_bytes column, what zero-bubble's I keeps for its W is priced as 0, so zb's
    memory is a lower bound: at 240 MiB the committed gpt profile without the column would pick a zb
    plan at 80% of the limit (its table says "yes?" and a warning says why), which with the measured
    column needs 243.3 MiB on its last rank (a 4-rank CPU run of that plan at 260 MiB measured
    243.2 MiB there, and the other ranks' 192.0, 61.4 and 160.9 MiB within 0.1 MiB of the model);
    with the column the plan is 1f1b and zb is refused."""
    args = ("--devices", 4, "--memory", "240MiB", "--global-batch", 32, "--out", tmp_path / "plan.json")
    measured = load_profile(ROOT / "profiles" / "gpt-8l-v32k.csv")
    assert "wgrad_bytes" in measured.present
    code, out, err = pplan("partition", ROOT / "profiles" / "gpt-8l-v32k.csv", *args)
    assert code == 0
    zb = [line for line in out.splitlines() if line.startswith("zb ")]
    assert all(line.split()[-1] == "NO" for line in zb), out  # where the table lists zb at all
    assert "yes?" not in out and "wgrad_bytes" not in err and load_plan(tmp_path / "plan.json").schedule == "1f1b"

    unmeasured = tmp_path / "no-wgrad.csv"  # the committed file without its wgrad_bytes column
    lines = (ROOT / "profiles" / "gpt-8l-v32k.csv").read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    drop = lines[header].split(",").index("wgrad_bytes")
    unmeasured.write_text("\n".join(lines[:header] + [",".join(c for k, c in enumerate(line.split(",")) if k != drop)
                                                       for line in lines[header:]]) + "\n", encoding="utf-8")
    assert "wgrad_bytes" not in load_profile(unmeasured).present
    code, out, err = pplan("partition", unmeasured, *args)
    assert code == 0
    zb = [line for line in out.splitlines() if line.startswith("zb ")]
    fits = [line.removesuffix("<- plan").split()[-1] for line in zb]
    assert "yes?" in fits and set(fits) <= {"yes?", "NO"}, out
    assert load_plan(tmp_path / "plan.json").schedule == "zb", out
    assert "yes?: fits if what the profile does not measure" in out
    assert "no wgrad_bytes column: the plan's memory leaves out what each micro-batch holds" in err  # the plan is zb
    # a 1f1b plan: zb without recompute needs 192.2 MiB there, 1f1b 192.0 (the embedding's stage); the table's rows
    code, out, err = pplan("partition", unmeasured, *args[:3], "192.1MiB", *args[4:])
    assert code == 0 and load_plan(tmp_path / "plan.json").schedule == "1f1b"
    assert "no wgrad_bytes column: the memory shown for interleaved and zb leaves out" in err


@pytest.mark.parametrize("profile, devices, batch, method", [("mlp", 2, 32, "auto"), ("gpt-8l-v32k", 2, 16, "uniform"),
                                                           ("gpt-8l-v32k", 2, 16, "params")])
def test_the_why_notes_agree_with_the_why_table(pplan, tmp_path, profile, devices, batch, method):
    """The notes on more or fewer micro-batches name the fastest such row of the table above them,
    from the same pool of cuts (any method's with auto, the one asked for otherwise): they once read
    the plan's own method only (mlp: zb M=2 at 7.5% where the table listed interleaved M=2 at 5.4%),
    then every method even under --method uniform ("cost -21.2% more", a row the table did not list)."""
    code, out, _ = pplan("partition", ROOT / "profiles" / f"{profile}.csv", "--devices", devices, "--global-batch", batch,
                         "--method", method, "--out", tmp_path / "plan.json")
    assert code == 0
    lines = out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("why "))) + 3:]
    rows = [line.split() for line in table[:table.index("") if "" in table else None] if not line.startswith("  ")]
    plan_row = next(r for r in rows if r[-1] == "plan")
    def span(r: list[str]) -> tuple[float, float]:
        """The ms a row's rounded iteration ("92.5 ms", "1.53 s") stands for, lowest and highest."""
        scale = 1000 if r[5] == "s" else 1
        half = 0.5 * 10 ** -len(r[4].partition(".")[2]) * scale
        return float(r[4]) * scale - half, float(r[4]) * scale + half

    notes = 0
    for words, more in (("more, smaller micro-batches", True), ("fewer, larger micro-batches", False)):
        note = next((line for line in lines if words in line), None)
        listed = [r for r in rows if (int(r[1]) > int(plan_row[1])) == more and r[1] != plan_row[1]
                  and r[-1] in ("yes", "yes?")]
        if note is None:
            assert not listed, out
            continue
        notes += 1
        pct = float(note.split(" cost ")[1].split("%")[0])
        assert pct >= 0, out  # the plan is the pool's fastest fitting candidate
        if listed:  # the table is ordered by iteration time: its first such row is the one named
            assert f"(best {listed[0][0]} M={listed[0][1]})" in note, out
            (low, high), (plan_low, plan_high) = span(listed[0]), span(plan_row)
            assert 100 * (low / plan_high - 1) - 0.05 <= pct <= 100 * (high / plan_low - 1) + 0.05, out  # times are rounded
    assert notes, out


def test_cluster_refuses_the_flags_its_file_sets(pplan, tmp_path):
    """examples/cluster.json gives every device memory and a default_link: --memory, --bandwidth and
    --latency would be ignored (a 1MB/s --bandwidth once left the prediction unchanged), so they are
    refused; a file that leaves them out takes them."""
    args = ("partition", ROOT / "profiles" / "mlp.csv", "--cluster", CLUSTER, "--global-batch", 32, "--out", tmp_path / "p.json")
    code, _, err = pplan(*args, "--bandwidth", "1MB/s", "--memory", "1GiB")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "p.json").exists()
    assert f"--memory and --bandwidth would be ignored with --cluster {CLUSTER}: every device in it has its own memory" in err
    assert "drop --memory and --bandwidth, or edit the cluster file" in err
    pair = tmp_path / "pair.json"  # no default_link, but a link of its own for every pair of devices
    pair.write_text(json.dumps({"format": "pplan-cluster/1", "devices": [{"name": "a"}, {"name": "b"}],
                                "links": [{"a": "a", "b": "b", "bandwidth": "25GB/s"}]}), encoding="utf-8")
    code, _, err = pplan("partition", ROOT / "profiles" / "mlp.csv", "--cluster", pair, "--global-batch", 32,
                         "--bandwidth", "1MB/s", "--latency", "50ms", "--out", tmp_path / "p.json")
    assert code == 2 and "--bandwidth and --latency would be ignored" in err and err.count("it links every pair") == 1
    data = json.loads(CLUSTER.read_text(encoding="utf-8"))
    del data["default_link"]
    del data["devices"][0]["memory"]
    open_file = tmp_path / "open.json"
    open_file.write_text(json.dumps(data), encoding="utf-8")
    plans = {}
    for bandwidth in ("1GB/s", "100MB/s"):
        code, _, err = pplan("partition", ROOT / "profiles" / "mlp.csv", "--cluster", open_file, "--global-batch", 32,
                             "--bandwidth", bandwidth, "--latency", "1ms", "--memory", "30GiB", "--out", tmp_path / f"{bandwidth}.json")
        assert code == 0, err
        plans[bandwidth] = load_plan(tmp_path / f"{bandwidth}.json")
    assert {p.links.bandwidth_bytes_per_s for p in plans.values()} == {1e9, 1e8}  # read where the file leaves it out
    assert plans["1GB/s"].devices[0].memory_bytes == 30 * 2**30 and plans["1GB/s"].links.latency_ms == 1.0
