"""Bad input never crashes: every case through the real CLI exits 2 with one line naming the problem.

The corpus is tests/data/bad/ (hand-made broken profiles and plans) plus files generated here
(a 100,000-layer profile, a directory, a missing file) and absurd command-line sizes. Each
case runs the CLI's entry point (`cli.app.main`) with `--out` pointing into a fresh folder,
and checks: exit code 2, exactly one `pplan: error:` line on stderr that names the problem,
no traceback, no Python warning, and no output file (nor a temporary one) left behind.

All cases run up front in this process, in one module fixture (helpers.cli.run_captured: every
warning recorded, an escaped exception shown as its traceback); a subprocess per case cost
~0.35 s of CPU each, 47 s of CPU for the file. Each case is still its own test, and
test_a_real_process_refuses_as_in_process runs one case per command as `python -m cli.app`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.cli import run_captured, run_pplan

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "data" / "bad"
GOOD_PROFILE = BAD / "good_profile.csv"
GOOD_PLAN = BAD / "good_plan.json"
_TIMEOUT_S = 30  # a bad input must be refused in well under this; more is a hang


@dataclass(frozen=True)
class Case:
    """One bad invocation and what its error must mention."""

    id: str
    args: tuple[str, ...]
    """CLI arguments; '{out}' is replaced by the output path, '{gen}' by the generated-files folder."""
    expect: str
    """Regular expression the error line must match (case-insensitive)."""
    out: str = "out.json"
    """Name of the output the command would write (a folder for report)."""


# ---- the corpus ---------------------------------------------------------------------------------

PROFILE_CASES = {  # file under tests/data/bad -> what the message must say
    "profile_truncated.csv": r"fields|truncated",
    "profile_wrong_header.csv": r"missing column",
    "profile_text_in_number.csv": r"'fast' is not a number",
    "profile_nan.csv": r"not a finite",
    "profile_inf.csv": r"not a finite",
    "profile_overflow.csv": r"not a finite",
    "profile_negative.csv": r"negative",
    "profile_duplicate_row.csv": r"duplicate row",
    "profile_layer_gap.csv": r"layer index 1 is missing",
    "profile_float_layer.csv": r"not an integer",
    "profile_zero_micro_batch.csv": r"micro_batch_size.*below 1",
    "profile_future_format.csv": r"not supported",
    "profile_header_only.csv": r"no data rows",
    "profile_empty.csv": r"empty profile",
    "profile_comments_only.csv": r"empty profile",
    "profile_binary.csv": r"binary",
    "profile_latin1.csv": r"UTF-8",
    "profile_param_bytes_vary.csv": r"different param_bytes",
    "profile_missing_size.csv": r"no row for micro_batch_size",
    # finite numbers whose sums overflow to inf: must be refused as absurd, not crash later
    "profile_huge_values.csv": r"too large|absurd|overflow|out of range",
    "{gen}/huge_100k.csv": r"more than \d+ layers",
    "{gen}/a_directory.csv": r"directory",
    "{gen}/missing.csv": r"does not exist",
}

PLAN_CASES = {
    "plan_invalid_json.json": r"invalid JSON",
    "plan_empty.json": r"invalid JSON",
    "plan_binary.json": r"not (a )?UTF-8",
    "plan_not_object.json": r"JSON object",
    "plan_missing_schedule.json": r"missing field schedule",
    "plan_missing_stages.json": r"missing field stages",
    "plan_wrong_type_microbatch.json": r"micro_batch_size must be an integer",
    "plan_bool_microbatches.json": r"n_microbatches must be an integer",
    "plan_float_microbatches.json": r"n_microbatches must be an integer",
    "plan_unknown_schedule.json": r"schedule 'pipedream' is unknown",
    "plan_zero_microbatches.json": r"at least 1",
    "plan_stages_overlap.json": r"overlaps",
    "plan_stages_gap.json": r"gap",
    "plan_stage_empty.json": r"is empty",
    "plan_stages_short.json": r"cover .*3.* 4 layers|4 layers.*3",
    "plan_device_out_of_range.json": r"device 5 is out of range",
    "plan_device_negative.json": r"device -1 is out of range",
    "plan_recompute_outside_stage.json": r"recompute layer 3 is outside",
    "plan_layers_not_pair.json": r"two integers",
    "plan_layers_strings.json": r"two integers",
    "plan_stage_not_object.json": r"must be an object",
    "plan_devices_empty.json": r"no devices",
    "plan_devices_zero.json": r"at least 1",
    "plan_memory_negative.json": r"memory_bytes must be positive",
    "plan_speed_zero.json": r"speed must be positive",
    "plan_bandwidth_zero.json": r"bandwidth_bytes_per_s must be positive",
    "plan_nan_latency.json": r"finite",
    "plan_unknown_optimizer.json": r"optimizer 'lion' is unknown",
    "plan_more_layers_than_profile.json": r"8 layers",
    "plan_huge_microbatches.json": r"too large",
    "plan_unused_device.json": r"3 devices",
    "plan_future_format.json": r"not supported",
    "{gen}/missing.json": r"does not exist",
}

# run and report share the loaders with simulate: a sample of the corpus goes through them too
_RUN_PLANS = ("plan_invalid_json.json", "plan_binary.json", "plan_missing_stages.json", "plan_stages_overlap.json",
              "plan_stages_gap.json", "plan_device_out_of_range.json", "plan_recompute_outside_stage.json",
              "plan_wrong_type_microbatch.json", "plan_more_layers_than_profile.json", "plan_huge_microbatches.json")
# (a plan the simulator cannot run at its sizes still gets a report without that figure: not here)
_REPORT_PLANS = ("plan_empty.json", "plan_stages_overlap.json", "plan_device_out_of_range.json",
                 "plan_recompute_outside_stage.json", "plan_unknown_schedule.json")
_SAMPLE_PROFILES = ("profile_truncated.csv", "profile_binary.csv", "profile_nan.csv", "profile_empty.csv",
                    "profile_huge_values.csv")

FLAG_BASE = {  # command -> (its arguments before the bad flags, the output it must not write)
    "partition": (("partition", str(GOOD_PROFILE), "--devices", "2", "--global-batch", "8", "--out", "{out}"), "out.json"),
    "simulate": (("simulate", str(GOOD_PLAN), "--out", "{out}", "--timeline", "{dir}/tl.csv"), "out.json"),
    "run": (("run", str(GOOD_PLAN), "--out", "{out}"), "out.json"),
    "profile": (("profile", "--out", "{dir}/profile.csv"), "profile.csv"),
}

# (command, case, flags, what the message must say). partition: absurd sizes and bad options on the
# good profile; profile: every one is refused before torch is imported or anything measured.
FLAG_CASES = [
    ("partition", "memory-negative", ("--memory", "-1"), r"negative"),
    ("partition", "memory-1e30", ("--memory", "1e30"), r"absurdly large"),
    ("partition", "memory-text", ("--memory", "lots"), r"cannot read --memory"),
    ("partition", "memory-tiny", ("--memory", "1KB"), r"no plan fits"),
    ("partition", "global-batch-0", ("--global-batch", "0"), r"global-batch 0 must be at least 1"),
    ("partition", "global-batch-absurd", ("--global-batch", "99999999999999999999999"), r"global.batch"),
    ("partition", "devices-0", ("--devices", "0"), r"devices must be at least 1"),
    ("partition", "devices-more-than-layers", ("--devices", "1000"), r"1000 devices but the profile has only 4 layers"),
    ("partition", "microbatches-not-divisor", ("--microbatches", "3"), r"not divisible"),
    ("partition", "microbatches-text", ("--microbatches", "many"), r"neither auto nor an integer"),
    ("partition", "bandwidth-0", ("--bandwidth", "0"), r"bandwidth"),
    ("partition", "latency-negative", ("--latency", "-1ms"), r"latency"),
    ("partition", "schedule-unknown", ("--schedule", "pipedream"), r"unknown schedule"),
    ("partition", "method-unknown", ("--method", "magic"), r"unknown method"),
    ("partition", "recompute-unknown", ("--recompute", "some"), r"unknown recompute"),
    ("partition", "optimizer-unknown", ("--optimizer", "lion"), r"unknown optimizer"),
    ("partition", "time-limit-0", ("--time-limit", "0"), r"time-limit must be positive"),
    ("partition", "cluster-missing", ("--cluster", "{gen}/missing.json"), r"does not exist|cluster"),
    ("partition", "cluster-not-json", ("--cluster", str(BAD / "profile_binary.csv")), r"cluster"),
    ("simulate", "microbatches-0", ("--microbatches", "0"), r"at least 1"),
    ("simulate", "microbatches-absurd", ("--microbatches", "1000000000000"), r"too large"),
    ("simulate", "micro-batch-size-0", ("--micro-batch-size", "0"), r"at least 1"),
    ("simulate", "bandwidth-negative", ("--bandwidth", "-5GB/s"), r"negative"),
    ("simulate", "latency-absurd", ("--latency", "1e300"), r"out of range"),
    ("simulate", "schedule-unknown", ("--schedule", "pipedream"), r"unknown"),
    ("simulate", "schedule-interleaved-1-stage-per-device", ("--schedule", "interleaved"), r"2 stages per device"),
    ("simulate", "sweep-garbage", ("--sweep", "nonsense"), r"cannot read --sweep"),
    ("simulate", "sweep-zero", ("--sweep", "microbatches=0"), r"between 1 and"),
    ("simulate", "calibration-missing", ("--calibration", "{gen}/missing.json"), r"does not exist"),
    ("simulate", "calibration-not-calibration", ("--calibration", str(GOOD_PLAN)), r"plan file .*not a calibration"),
    ("run", "steps-0", ("--steps", "0"), r"--steps 0"),
    ("run", "warmup-negative", ("--warmup", "-1"), r"--warmup -1"),
    ("run", "device-unknown", ("--device", "tpu"), r"--device 'tpu'"),
    ("run", "timeout-0", ("--timeout", "0"), r"--timeout"),
    ("run", "threads-negative", ("--threads", "-1"), r"--threads"),
    ("run", "lr-nan", ("--lr", "nan"), r"--lr"),
    ("run", "runtime-unknown", ("--runtime", "jax"), r"--runtime 'jax'"),
    ("run", "checkpoint-every-without-dir", ("--checkpoint-every", "2"), r"needs --checkpoint-dir"),
    ("profile", "model-unknown", ("--model", "transformerXL"), r"unknown model"),
    ("profile", "model-negative-layers", ("--model", "gpt:layers=-1"), r"below 1"),
    ("profile", "model-nan", ("--model", "synthetic:fwd_ms=nan"), r"not finite"),
    ("profile", "model-absurd-layers", ("--model", "synthetic:layers=100000000"), r"too large"),
    ("profile", "sizes-zero", ("--model", "synthetic", "-b", "0"), r"positive integers"),
    ("profile", "sizes-text", ("--model", "synthetic", "-b", "big"), r"comma-separated"),
    ("profile", "repeats-zero", ("--model", "synthetic", "--repeats", "0"), r"repeats"),
    ("profile", "dtype-unknown", ("--model", "synthetic", "--dtype", "int3"), r"dtype"),
    ("profile", "device-unknown", ("--model", "synthetic", "--device", "tpu"), r"device"),
    ("profile", "out-not-csv", ("--model", "synthetic", "--out", "{dir}/profile.txt"), r"\.csv"),
]


def _cases() -> list[Case]:
    cases: list[Case] = []
    base_partition = ("--devices", "2", "--global-batch", "4", "--out", "{out}")
    for name, rx in PROFILE_CASES.items():
        f = name if name.startswith("{gen}") else str(BAD / name)
        cases.append(Case(f"partition[{Path(name).name}]", ("partition", f, *base_partition), rx))
    for name in _SAMPLE_PROFILES:
        rx = PROFILE_CASES[name]
        cases.append(Case(f"simulate-profile[{name}]", ("simulate", str(GOOD_PLAN), "--profile", str(BAD / name), "--out", "{out}"), rx))
        cases.append(Case(f"report-profile[{name}]", ("report", "--profile", str(BAD / name), "--out", "{out}"), rx, out="report"))
        cases.append(Case(f"run-profile[{name}]", ("run", str(GOOD_PLAN), "--profile", str(BAD / name), "--out", "{out}"), rx))
    for name, rx in PLAN_CASES.items():
        f = name if name.startswith("{gen}") else str(BAD / name)
        cases.append(Case(f"simulate[{Path(name).name}]", ("simulate", f, "--profile", str(GOOD_PROFILE), "--out", "{out}"), rx))
    for name in _RUN_PLANS:
        cases.append(Case(f"run[{name}]", ("run", str(BAD / name), "--out", "{out}", "--timeline", "{dir}/tl.csv"), PLAN_CASES[name]))
    for name in _REPORT_PLANS:
        cases.append(Case(f"report[{name}]", ("report", "--plan", str(BAD / name), "--profile", str(GOOD_PROFILE), "--out", "{out}"),
                          PLAN_CASES[name], out="report"))
    for command, key, flags, rx in FLAG_CASES:
        base, out = FLAG_BASE[command]
        cases.append(Case(f"{command}-flag[{key}]", (*base, *flags), rx, out=out))
    cases.append(Case("report-flag[formats-gif]", ("report", "--profile", str(GOOD_PROFILE), "--formats", "gif", "--out", "{out}"),
                      r"format", out="report"))
    cases.append(Case("bench-flag[layers-zero]", ("bench", "planner", "--layers", "0", "--out-dir", "{out}"), r"--layers", out="bench"))
    cases.append(Case("bench-flag[sizes-garbage]", ("bench", "simulator", "--sizes", "huge", "--out-dir", "{out}"), r"--sizes", out="bench"))
    return cases


CASES = _cases()


def _generate(gen: Path) -> None:
    """Inputs too big or too odd to commit: a 100,000-layer profile, a directory named .csv."""
    gen.mkdir(parents=True, exist_ok=True)
    header = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n"
    rows = "".join(f"{i},l{i},1,0.1,0.2,1000,1000,100\n" for i in range(100_000))
    (gen / "huge_100k.csv").write_text(header + rows, encoding="utf-8")
    (gen / "a_directory.csv").mkdir(exist_ok=True)


@dataclass(frozen=True)
class Outcome:
    """What one case's command did."""

    code: int
    """Its exit code."""
    stdout: str
    """Its stdout."""
    stderr: str
    """Its stderr, with any traceback and Python warning."""
    out: Path
    """The output it must not have written."""
    folder: Path
    """Its own working folder (no temporary file may stay there)."""


def _run(case: Case, base: Path, gen: Path) -> Outcome:
    folder = base / re.sub(r"[^A-Za-z0-9_.-]", "_", case.id)
    folder.mkdir(parents=True)
    out = folder / case.out
    args = [a.replace("{out}", str(out)).replace("{gen}", str(gen)).replace("{dir}", str(folder)) for a in case.args]
    got = run_captured(*args, cwd=folder, timeout_s=_TIMEOUT_S)  # a numpy overflow warning is a symptom: it shows
    return Outcome(got.code, got.out, got.err, out, folder)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    base = tmp_path_factory.mktemp("bad")
    gen = base / "_generated"
    _generate(gen)
    return {c.id: _run(c, base, gen) for c in CASES}


def _check(case: Case, o: Outcome) -> None:
    err = o.stderr
    assert "Traceback" not in err, f"{case.id}: traceback on stderr:\n{err}"
    assert "Warning" not in err, f"{case.id}: Python warning on stderr:\n{err}"
    assert o.code == 2, f"{case.id}: exit code {o.code}, expected 2; stderr:\n{err}"
    errors = [ln for ln in err.splitlines() if ln.startswith("pplan: error:")]
    assert len(errors) == 1, f"{case.id}: expected one 'pplan: error:' line, got:\n{err}"
    assert "No such command" not in err and "Usage:" not in err, f"{case.id}: the command itself is missing:\n{err}"
    assert re.search(case.expect, errors[0], re.IGNORECASE), f"{case.id}: {errors[0]!r} does not name the problem ({case.expect})"
    assert not o.out.exists(), f"{case.id}: partial output {o.out} was left behind"
    leftovers = [p.name for p in o.folder.iterdir() if p.name.endswith(".tmp") or p.name in ("tl.csv",)]
    assert not leftovers, f"{case.id}: left files {leftovers}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: Case, outcomes: dict[str, Outcome]) -> None:
    _check(case, outcomes[case.id])


def test_a_real_process_refuses_as_in_process(outcomes: dict[str, Outcome], tmp_path: Path) -> None:
    """The first case of each command again as `python -m cli.app ...` (what a user runs, warnings
    on): the same exit code and the same checks, so running the rest in-process hides nothing."""
    firsts = list({c.args[0]: c for c in reversed(CASES)}.values())
    assert {c.args[0] for c in firsts} == {"partition", "simulate", "run", "report", "profile", "bench"}

    def real(case: Case) -> Outcome:
        folder = tmp_path / re.sub(r"[^A-Za-z0-9_.-]", "_", case.id)
        folder.mkdir()
        gen = tmp_path / "_generated"
        args = [a.replace("{out}", str(folder / case.out)).replace("{gen}", str(gen)).replace("{dir}", str(folder))
                for a in case.args]
        proc = run_pplan(*args, cwd=folder, timeout=_TIMEOUT_S, PYTHONWARNINGS="default")
        return Outcome(proc.returncode, proc.stdout, proc.stderr, folder / case.out, folder)

    _generate(tmp_path / "_generated")
    with ThreadPoolExecutor(max_workers=2) as pool:
        for case, o in zip(firsts, pool.map(real, firsts)):
            _check(case, o)
            assert o.code == outcomes[case.id].code, case.id


def test_corpus_files_exist_and_cases_are_unique() -> None:
    """Guards the corpus itself: every named file is there and each case id is distinct."""
    for name in list(PROFILE_CASES) + list(PLAN_CASES):
        if not name.startswith("{gen}"):
            assert (BAD / name).is_file(), name
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    committed = {p.name for p in BAD.iterdir() if p.name.startswith(("profile_", "plan_"))}
    assert committed <= set(PROFILE_CASES) | set(PLAN_CASES), committed - set(PROFILE_CASES) - set(PLAN_CASES)
