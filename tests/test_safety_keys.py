"""No key is silently ignored, and no absurd number is accepted, in any JSON pplan reads.

Plan, cluster, calibration, simulation and run files may come from someone else. A typo such as
`memroy` or `optimiser` must be refused (naming the key, where it is, and the nearest known
key), not ignored; numbers far outside what any machine has (1e30 bytes, 10**12 micro-batches,
a 1e308 calibration factor) must be refused at load, not overflow to inf later; and odd JSON
(duplicate keys, deep nesting, a 5,000-digit integer, 1e400) gives one line, not a traceback.

Each case mutates a committed good file, writes it to a fresh folder and runs the CLI's entry
point (`cli.app.main`): exit code 2, one `pplan: error:` line naming the problem, no traceback,
no Python warning, and no output file. Cases run in this process in one module fixture
(helpers.cli.run_captured; a subprocess per case cost ~0.35 s of CPU, 28 s for the file), and
test_a_real_process_refuses_as_in_process runs one case per command as `python -m cli.app`.
The unit tests at the end check the other direction: everything pplan writes loads back.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import run_captured, run_pplan

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
GOOD_PROFILE = DATA / "bad" / "good_profile.csv"
GOOD_PLAN = json.loads((DATA / "bad" / "good_plan.json").read_text(encoding="utf-8"))
FULL_PLAN = json.loads((DATA / "report" / "plan.json").read_text(encoding="utf-8"))  # with predicted and search
GOOD_RUN = json.loads((DATA / "report" / "run.json").read_text(encoding="utf-8"))
GOOD_SIM = json.loads((DATA / "report" / "sim.json").read_text(encoding="utf-8"))
GOOD_CLUSTER = {"format": "pplan-cluster/1",
                "devices": [{"name": "a", "memory": "1GiB", "speed": 1.0}, {"name": "b", "memory": "1GiB", "speed": 0.5}],
                "default_link": {"bandwidth": "25GB/s", "latency": "0.01ms"},
                "links": [{"a": "a", "b": "b", "bandwidth": "300GB/s", "latency": "5us"}]}
GOOD_CALIBRATION = {"format": "pplan-calibration/1", "compute_scale": 1.2, "action_overhead_ms": 0.1,
                    "comm_latency_ms": 0.02, "comm_bandwidth_bytes_per_s": 2.5e9, "step_overhead_ms": 3.0,
                    "fitted_from": {"run": "run.json", "schedule": "1f1b", "n_ranks": 2, "n_microbatches": 4,
                                    "measured_ms": 100.0, "error_pct_before": -10.0, "error_pct_after": 0.0}}
_TIMEOUT_S = 30


def _edit(base: Any, fn: Callable[[Any], None]) -> str:
    data = copy.deepcopy(base)
    fn(data)
    return json.dumps(data, indent=1)


def _set(path: str, value: Any) -> Callable[[Any], None]:
    """Set data[a][0][b] = value for path 'a.0.b' (creating nothing but the last key)."""
    def fn(data: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[int(key)] if key.isdigit() else data[key]
        data[int(last) if last.isdigit() else last] = value
    return fn


def _rename(path: str, new: str) -> Callable[[Any], None]:
    """Rename the key at 'a.0.b' to `new` (the typo a person makes)."""
    def fn(data: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[int(key)] if key.isdigit() else data[key]
        data[new] = data.pop(last)
    return fn


def _odd_json(good: Any) -> dict[str, tuple[str, str]]:
    """Raw-text cases every JSON reader must turn into one line: name -> (text, expected)."""
    text = json.dumps(good)
    first_key = next(iter(good))
    return {
        "duplicate-key": ("{" + json.dumps(first_key) + ": 1, " + text[1:], rf"{first_key}.*appears twice"),
        "deep-nesting": (text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", r"nests deeper"),
        "5000-digit-integer": (text[:-1] + ', "big": ' + "9" * 5000 + "}", r"5000 digits"),
        "1e400": (text[:-1] + ', "huge": 1e400}', r"1e400.*out of range"),
    }


@dataclass(frozen=True)
class Case:
    """One bad file given to one command, and what its error line must say."""

    id: str
    command: str
    """plan | plan-report | cluster | calibration | calibration-beside | run | sim | partition-flags"""
    text: str
    """The file's content (for partition-flags: the extra command-line flags)."""
    expect: str
    """Regular expression the error line must match (case-insensitive)."""


# A key renamed to a typo, in each kind of file (its good example, and what a top-level key's
# error calls the file); the error must say where the key is, the typo, and the key meant.
GOOD = {"plan": (GOOD_PLAN, "plan"), "plan-report": (FULL_PLAN, "plan"), "cluster": (GOOD_CLUSTER, "cluster"),
        "calibration": (GOOD_CALIBRATION, "calibration"), "run": (GOOD_RUN, "run"), "sim": (GOOD_SIM, "simulation")}
TYPOS = [  # (command, id, key path 'a.0.b', the typo)
    ("plan", "device-memory", "devices.0.memory_bytes", "memory"),
    ("plan", "links-bandwith", "links.bandwidth_bytes_per_s", "bandwith_bytes_per_s"),
    ("plan", "stage-recomputed", "stages.1.recompute", "recomputed"),
    ("plan", "micro-batches", "n_microbatches", "n_micro_batches"),
    # predicted and search, as `pplan partition` writes them, through `pplan report --plan`
    ("plan-report", "predicted-iteration", "predicted.iteration_ms", "iteration"),
    ("plan-report", "predicted-device", "predicted.devices.0.peak_memory_bytes", "peak_memory"),
    ("plan-report", "predicted-memory", "predicted.devices.1.memory.weights", "weight"),
    ("plan-report", "search-candiates", "search.candidates", "candiates"),
    ("plan-report", "search-baseline-row", "search.baselines.0.iteration_ms", "iteration_msec"),
    ("cluster", "device-memroy", "devices.0.memory", "memroy"),
    ("cluster", "link-bandwith", "links.0.bandwidth", "bandwith"),
    ("cluster", "default-latncy", "default_link.latency", "latncy"),
    ("cluster", "top-default-links", "default_link", "default_links"),
    ("cluster", "device-memory-bytes", "devices.1.memory", "memory_bytes"),
    ("calibration", "compute-scael", "compute_scale", "compute_scael"),
    ("calibration", "step-overhead", "step_overhead_ms", "step_overhead"),
    ("calibration", "fitted-from-runn", "fitted_from.run", "runn"),
    ("run", "top-step-mss", "step_ms", "step_mss"),
    ("run", "rank-peak", "ranks.0.peak_memory_bytes_measured", "peak_memory_measured"),
    ("run", "rank-memory", "ranks.1.memory_measured.weights", "weight"),
    ("sim", "top-bubble", "bubble_fraction", "bubble"),
    ("sim", "device-busy", "devices.0.busy_ms", "busy"),
]


def _typo_cases() -> list[Case]:
    cases = []
    for command, name, path, typo in TYPOS:
        good, top = GOOD[command]
        *parents, last = path.split(".")
        where = "".join(f"[{k}]" if k.isdigit() else f".{k}" for k in parents).lstrip(".") or top  # 'a[0].b'
        cases.append(Case(f"{command}[{name}]", command, _edit(good, _rename(path, typo)),
                          rf"{re.escape(where)}: unknown key '{typo}'; did you mean '{last}'\?"))
    return cases


def _plan_cases() -> list[Case]:
    key = [  # (id, edit, expected): unknown keys added at every level of a plan
        ("top-optimiser", _set("optimiser", "adam"), r"plan: unknown key 'optimiser'; did you mean 'optimizer'\?"),
        ("pair-latency", _set("links.pairs", [{"a": 0, "b": 1, "bandwidth_bytes_per_s": 1e9, "latency": 0.1}]),
         r"links.pairs\[0\]: unknown key 'latency'; did you mean 'latency_ms'\?"),
        ("profile-sha", _set("profile.sha", "abc"), r"profile: unknown key 'sha'; did you mean 'sha256'\?"),
    ]
    full = [  # predicted and search, as `pplan partition` writes them, through `pplan report --plan`
        ("search-at-plan-setting", _set("search.baselines.0.at_plan_setting", {"fits": True, "iteration": 1.0}),
         r"at_plan_setting: unknown key 'iteration'; did you mean 'iteration_ms'\?"),
        ("global-batch-mismatch", _set("global_batch", 999), r"global_batch 999 is not micro_batch_size"),
    ]
    numbers = [  # absurd values: refused at load, before anything allocates or overflows
        ("memory-1e30", _set("devices.0.memory_bytes", 1e30), r"memory_bytes 1e\+30 is absurdly large"),
        ("memory-40-digits", _set("devices.0.memory_bytes", 10**39), r"memory_bytes .* is absurdly large"),
        ("microbatch-size-1e9", _set("micro_batch_size", 10**9), r"micro_batch_size 1000000000 .* too large"),
        ("devices-1e9", _set("devices", 10**9), r"devices is 1000000000 but the plan has 2 stages"),
        ("latency-1e300", _set("links.latency_ms", 1e300), r"latency_ms 1e\+300 is out of range"),
        ("bandwidth-tiny", _set("links.bandwidth_bytes_per_s", 1e-300), r"bandwidth_bytes_per_s 1e-300 is out of range"),
        ("bandwidth-1e300", _set("links.bandwidth_bytes_per_s", 1e300), r"bandwidth_bytes_per_s 1e\+300 is out of range"),
        ("speed-tiny", _set("devices.0.speed", 1e-300), r"speed 1e-300 is out of range"),
        ("speed-huge", _set("devices.1.speed", 1e300), r"speed 1e\+300 is out of range"),
        ("pair-device-out-of-range", _set("links.pairs", [{"a": 0, "b": 7, "bandwidth_bytes_per_s": 1e9, "latency_ms": 0.1}]),
         r"links.pairs\[0\]: device 7 is out of range"),
        ("pair-self", _set("links.pairs", [{"a": 1, "b": 1, "bandwidth_bytes_per_s": 1e9, "latency_ms": 0.1}]),
         r"links device 1 to itself"),
        ("seed-huge", _set("seed", 10**30), r"seed .* out of range"),
    ]
    cases = [Case(f"plan[{i}]", "plan", _edit(GOOD_PLAN, fn), rx) for i, fn, rx in key]
    cases += [Case(f"plan-report[{i}]", "plan-report", _edit(FULL_PLAN, fn), rx) for i, fn, rx in full]
    cases += [Case(f"plan[{i}]", "plan", _edit(GOOD_PLAN, fn), rx) for i, fn, rx in numbers]
    cases += [Case(f"plan[{i}]", "plan", text, rx) for i, (text, rx) in _odd_json(GOOD_PLAN).items()]
    # unknown keys reach `pplan report --plan` as well as `pplan simulate`
    cases.append(Case("plan-report[optimiser]", "plan-report", _edit(FULL_PLAN, _set("optimiser", "adam")),
                      r"unknown key 'optimiser'; did you mean 'optimizer'\?"))
    return cases


def _cluster_cases() -> list[Case]:
    edits = [
        ("speed-tiny", _set("devices.1.speed", 1e-9), r"speed must be a positive number .*1e-09"),
    ]
    cases = [Case(f"cluster[{i}]", "cluster", _edit(GOOD_CLUSTER, fn), rx) for i, fn, rx in edits]
    cases += [Case(f"cluster[{i}]", "cluster", text, rx) for i, (text, rx) in _odd_json(GOOD_CLUSTER).items()]
    return cases


def _calibration_cases() -> list[Case]:
    edits = [
        ("compute-scale-1e308", _set("compute_scale", 1e308), r"compute_scale 1e\+308 is out of range"),
        ("compute-scale-tiny", _set("compute_scale", 1e-300), r"compute_scale 1e-300 is out of range"),
        ("action-overhead-1e308", _set("action_overhead_ms", 1e308), r"action_overhead_ms 1e\+308 is out of range"),
        ("step-overhead-1e308", _set("step_overhead_ms", 1e308), r"step_overhead_ms 1e\+308 is out of range"),
        ("latency-1e308", _set("comm_latency_ms", 1e308), r"comm_latency_ms 1e\+308 is out of range"),
        ("bandwidth-tiny", _set("comm_bandwidth_bytes_per_s", 1e-300), r"comm_bandwidth_bytes_per_s 1e-300 is out of range"),
        ("bandwidth-1e308", _set("comm_bandwidth_bytes_per_s", 1e308), r"comm_bandwidth_bytes_per_s 1e\+308 is out of range"),
        ("fitted-from-not-object", _set("fitted_from", [1, 2]), r"fitted_from must be an object"),
    ]
    cases = [Case(f"calibration[{i}]", "calibration", _edit(GOOD_CALIBRATION, fn), rx) for i, fn, rx in edits]
    cases += [Case(f"calibration[{i}]", "calibration", text, rx) for i, (text, rx) in _odd_json(GOOD_CALIBRATION).items()]
    # `pplan partition` picks up the calibration beside the profile without a flag
    cases.append(Case("calibration-beside[compute-scael]", "calibration-beside",
                      _edit(GOOD_CALIBRATION, _rename("compute_scale", "compute_scael")), r"did you mean 'compute_scale'\?"))
    cases.append(Case("calibration-beside[compute-scale-1e308]", "calibration-beside",
                      _edit(GOOD_CALIBRATION, _set("compute_scale", 1e308)), r"compute_scale 1e\+308 is out of range"))
    return cases


def _report_cases() -> list[Case]:
    run = [
        ("comm-latency", _set("comm", [{"a": 0, "b": 1, "latency": 0.1, "bandwidth_bytes_per_s": 1e9, "points": []}]),
         r"comm\[0\]: unknown key 'latency'; did you mean 'latency_ms'\?"),
        ("calibration-fit-point", _set("calibration_fit", {"measured_ms": 1.0, "compute_points": [{"action": "0F", "profiled": 1.0}]}),
         r"compute_points\[0\]: unknown key 'profiled'; did you mean 'profiled_ms'\?"),
        ("calibration", _set("calibration", {"compute_scael": 1.0}), r"calibration: unknown key 'compute_scael'; did you mean 'compute_scale'\?"),
        ("action-key", _set("ranks.0.action_ms", {"0F": 1.0, "forward": 2.0}), r"action_ms: unknown key 'forward'"),
    ]
    sim = [
        ("memory-timeline-key", _set("memory_timeline.cpu0", []), r"memory_timeline: unknown key 'cpu0'"),
    ]
    cases = [Case(f"run[{i}]", "run", _edit(GOOD_RUN, fn), rx) for i, fn, rx in run]
    cases += [Case(f"run[{i}]", "run", text, rx) for i, (text, rx) in _odd_json(GOOD_RUN).items()]
    cases += [Case(f"sim[{i}]", "sim", _edit(GOOD_SIM, fn), rx) for i, fn, rx in sim]
    cases += [Case(f"sim[{i}]", "sim", text, rx) for i, (text, rx) in _odd_json(GOOD_SIM).items()]
    return cases


# What pplan writes must load back: a value the plan's loader would refuse is refused where it is
# given (the parser holds bandwidths to planner.limits), so no plan is built and nothing is written
WRITE_CASES = [Case("partition-writes[bandwidth-0.5]", "partition-flags", "--bandwidth 0.5",
                    r"bandwidth '0.5' \(0.5 bytes/s\) is below 1e\+06 bytes/s")]

CASES = _typo_cases() + _plan_cases() + _cluster_cases() + _calibration_cases() + _report_cases() + WRITE_CASES


def _args(case: Case, folder: Path) -> tuple[list[str], Path]:
    """The command line for `case` (its file written into `folder`), and the output it must not write."""
    name = {"cluster": "cluster.json", "calibration": "c.calibration.json", "calibration-beside": "prof.calibration.json",
            "run": "run.json", "sim": "sim.json"}.get(case.command, "plan.json")
    (folder / name).write_text(case.text, encoding="utf-8")
    f, out = str(folder / name), folder / "out.json"
    if case.command == "partition-flags":
        return ["partition", str(GOOD_PROFILE), "--devices", "2", "--global-batch", "4", *case.text.split(), "--out", str(out)], out
    if case.command == "plan":
        return ["simulate", f, "--profile", str(GOOD_PROFILE), "--out", str(out)], out
    if case.command == "calibration":
        return ["simulate", str(DATA / "bad" / "good_plan.json"), "--profile", str(GOOD_PROFILE), "--calibration", f,
                "--out", str(out)], out
    if case.command == "calibration-beside":
        shutil.copy(GOOD_PROFILE, folder / "prof.csv")
        return ["partition", str(folder / "prof.csv"), "--devices", "2", "--global-batch", "4", "--out", str(out)], out
    if case.command == "cluster":
        return ["partition", str(GOOD_PROFILE), "--cluster", f, "--global-batch", "4", "--out", str(out)], out
    report = folder / "report"
    flag = {"plan-report": "--plan", "run": "--run", "sim": "--sim"}[case.command]
    return ["report", flag, f, "--out", str(report)], report


@dataclass(frozen=True)
class Outcome:
    """What one case's command did."""

    code: int
    """Its exit code."""
    stderr: str
    """Its stderr, with any traceback and Python warning."""
    out: Path
    """The output it must not have written."""


def _run(case: Case, base: Path, real: bool = False) -> Outcome:
    """`case` in this process, or (`real`) as `python -m cli.app ...` in a subprocess, warnings on."""
    folder = base / re.sub(r"[^A-Za-z0-9_.-]", "_", case.id)
    folder.mkdir(parents=True)
    args, out = _args(case, folder)
    if real:
        proc = run_pplan(*args, cwd=folder, timeout=_TIMEOUT_S, PYTHONWARNINGS="default")
        return Outcome(proc.returncode, proc.stderr, out)
    got = run_captured(*args, cwd=folder, timeout_s=_TIMEOUT_S)
    return Outcome(got.code, got.err, out)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    base = tmp_path_factory.mktemp("keys")
    return {c.id: _run(c, base) for c in CASES}


def _check(case: Case, o: Outcome) -> None:
    assert "Traceback" not in o.stderr, f"{case.id}: traceback:\n{o.stderr[-3000:]}"
    assert o.code == 2, f"{case.id}: exit code {o.code}, expected 2; stderr:\n{o.stderr[-3000:]}"
    lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("pplan: error:")]
    assert len(errors) == 1 and len(lines) == 1, f"{case.id}: expected one line, got:\n{o.stderr}"
    assert re.search(case.expect, errors[0], re.IGNORECASE), f"{case.id}: {errors[0]!r} does not match {case.expect!r}"
    assert len(errors[0]) < 400, f"{case.id}: error line too long ({len(errors[0])} chars)"
    assert not o.out.exists(), f"{case.id}: output {o.out} was written"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_with_one_line_naming_the_key(case: Case, outcomes: dict[str, Outcome]) -> None:
    _check(case, outcomes[case.id])


def test_a_real_process_refuses_as_in_process(outcomes: dict[str, Outcome], tmp_path: Path) -> None:
    """The first case of each kind of file again as `python -m cli.app ...` (what a user runs):
    the same exit code and the same checks, so running the rest in-process hides nothing."""
    firsts = list({c.command: c for c in reversed(CASES)}.values())
    assert {c.command for c in firsts} == set(GOOD) | {"calibration-beside", "partition-flags"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for case, o in zip(firsts, pool.map(lambda c: _run(c, tmp_path, real=True), firsts)):
            _check(case, o)
            assert o.code == outcomes[case.id].code, case.id


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


# ---- the other direction: what pplan writes, and every committed file, loads back -------------

def test_committed_files_load() -> None:
    from planner.calibration import load_calibration
    from planner.cluster import load_cluster
    from planner.plan import load_plan
    from planner.report.inputs import load_run, load_sim

    plans = [*ROOT.glob("reports/**/plan*.json"), DATA / "report" / "plan.json", DATA / "sim_plan.json",
             DATA / "bad" / "good_plan.json"]
    assert len(plans) >= 6
    for p in plans:
        load_plan(p)
    for p in ROOT.glob("examples/cluster*.json"):
        load_cluster(p)
    for p in [*ROOT.glob("reports/**/*.calibration.json"), *ROOT.glob("profiles/**/*.calibration.json")]:
        load_calibration(p)
    for p in [*ROOT.glob("reports/**/run*.json"), DATA / "report" / "run.json"]:
        load_run(p)
    for p in [*ROOT.glob("reports/**/sim*.json"), DATA / "report" / "sim.json"]:
        load_sim(p)


def test_partitioned_plan_and_its_simulation_load_back(tmp_path) -> None:
    """`pplan partition`'s plan (predicted and search included) and `pplan simulate`'s JSON pass the key checks."""
    from planner.partition import PartitionSettings, partition
    from planner.plan import load_plan, plan_to_json, write_plan
    from planner.profiling.profile import load_profile
    from planner.report.inputs import parse_sim
    from planner.simulate import simulate

    prof = load_profile(GOOD_PROFILE)
    plan = partition(prof, PartitionSettings(n_devices=2, memory_bytes=None, global_batch=4)).plan
    assert plan.predicted and plan.search
    write_plan(plan, tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert plan_to_json(again) == (tmp_path / "p.json").read_text(encoding="utf-8")
    parse_sim(json.loads(json.dumps(simulate(again, prof).to_dict())))


def test_calibration_refuses_absurd_values_on_construction(tmp_path) -> None:
    """What write_calibration writes, load_calibration reads: out-of-range values cannot be built."""
    from planner.calibration import RANGES, Calibration, load_calibration, write_calibration
    from planner.errors import PplanError

    for name, (low, high) in RANGES.items():
        for bad in (high * 10, -1.0, float("inf"), float("nan")):
            with pytest.raises(PplanError, match=name):
                Calibration(**{name: bad})
        for good in (low, high):
            cal = Calibration(**{name: good}, fitted_from={"run": "x", "measured_ms": 1.0})
            write_calibration(cal, tmp_path / "c.json")
            assert load_calibration(tmp_path / "c.json") == cal
    with pytest.raises(PplanError, match="did you mean 'run'"):
        Calibration(fitted_from={"runn": "x"})
    with pytest.raises(PplanError, match="measured_ms"):
        Calibration(fitted_from={"measured_ms": float("inf")})


def test_bounds_of_plan_values_are_inclusive() -> None:
    from planner.plan import MAX_BANDWIDTH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MAX_SPEED, MIN_BANDWIDTH, plan_from_dict

    d = copy.deepcopy(GOOD_PLAN)
    d["devices"][0].update(memory_bytes=MAX_MEMORY_BYTES, speed=MAX_SPEED)
    d["links"] = {"bandwidth_bytes_per_s": MIN_BANDWIDTH, "latency_ms": MAX_LATENCY_MS,
                  "pairs": [{"a": 0, "b": 1, "bandwidth_bytes_per_s": MAX_BANDWIDTH, "latency_ms": 0.0}]}
    plan_from_dict(d)


def test_max_global_batch_matches_the_partitioner() -> None:
    from planner.limits import MAX_GLOBAL_BATCH
    from planner.plan import MAX_GLOBAL_BATCH as PLAN_MAX

    assert PLAN_MAX == MAX_GLOBAL_BATCH
