"""A newcomer's path through the CLI: every refusal says what to give instead (a hint), --help
describes what is accepted, and a suggestion is one the next command accepts."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers.cli import one_error_line
from planner.errors import InfeasibleError
from planner.execute.preflight import co_run_advice
from planner.hardware import load_hardware
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile

DATA = Path(__file__).parent / "data" / "report"
PLAN, PROFILE = DATA / "plan.json", DATA / "profile.csv"


def _refusal(pplan, *args: object) -> tuple[str, str]:
    """(message, hint) of a one-line refusal, split where cli.app joins them."""
    line = one_error_line(*pplan(*args)[::2]).removeprefix("pplan: error: ")
    message, sep, hint = line.partition("; ")
    assert sep, f"no hint in {line!r}"
    return message, hint


def test_a_folder_given_for_the_profile_names_a_csv_file_in_it(pplan, tmp_path):
    (tmp_path / "gpt.csv").write_text("# format: pplan-profile/1\n")  # only its first bytes are read
    (tmp_path / "notes.txt").write_text("")
    message, hint = _refusal(pplan, "partition", tmp_path, "-n", 2, "--global-batch", 8, "-o", tmp_path / "p.json")
    assert "is a directory" in message and str(tmp_path / "gpt.csv") in hint
    assert not (tmp_path / "p.json").exists()


def test_an_empty_folder_given_for_a_plan_says_it_holds_none(pplan, tmp_path):
    message, hint = _refusal(pplan, "simulate", tmp_path)
    assert message.startswith("plan ") and "is a directory" in message and "holds no plan JSON" in hint


def test_a_batch_of_no_samples_says_what_to_give(pplan, tmp_path):
    message, hint = _refusal(pplan, "partition", PROFILE, "-n", 2, "--global-batch", 0, "-o", tmp_path / "p.json")
    assert "--global-batch 0 must be at least 1" in message and "--global-batch 64" in hint
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args, example", [
    (("simulate", PLAN, "--microbatches", 0), "--microbatches 8"),
    (("simulate", PLAN, "--micro-batch-size", -1), "--micro-batch-size 4"),
    (("run", PLAN, "--steps", 0), "--steps 10"),
    (("run", PLAN, "--warmup", -1), "--warmup 2"),
    (("run", PLAN, "--checkpoint-every", -1), "--checkpoint-every 100"),
])
def test_counts_below_their_least_say_what_to_give(pplan, args, example):
    message, hint = _refusal(pplan, *args)
    assert f"{args[-2]} {args[-1]} must be at least" in message and example in hint


def test_calibrate_from_a_missing_run_names_the_command_that_writes_one(pplan, tmp_path):
    missing = tmp_path / "MISSING.json"
    message, hint = _refusal(pplan, "calibrate", PLAN, "--from-run", missing)
    assert message == f"run {str(missing)!r} does not exist" and "pplan run PLAN.json --out RUN.json" in hint


def test_calibrate_without_a_plan_says_how_to_give_one(pplan):
    message, hint = _refusal(pplan, "calibrate")
    assert "PLAN.json" in message and "pplan calibrate PLAN.json" in hint and "--machine" in hint


@pytest.mark.parametrize("flag, command", [("--run", "pplan run"), ("--sim", "pplan simulate"),
                                           ("--measured-timeline", "pplan run")])
def test_report_inputs_that_do_not_exist_name_the_command_that_writes_them(pplan, tmp_path, flag, command):
    _, hint = _refusal(pplan, "report", flag, tmp_path / "nope.json", "--out", tmp_path / "r")
    assert command in hint


def test_a_missing_hardware_file_names_the_presets(pplan, tmp_path):
    _, hint = _refusal(pplan, "hardware", tmp_path / "mine.json")
    assert "a100-80gb" in hint and "pplan hardware a100-80gb --json" in hint


def test_profile_help_names_every_kind_of_model(pplan):
    code, out, _ = pplan("profile", "--help")
    text = " ".join(out.split())
    assert code == 0 and "hf:MODEL_TYPE" in text and "torch.fx" in text


def test_an_unknown_model_lists_hf_and_any_traceable_module(pplan):
    _, hint = _refusal(pplan, "profile", "-m", "transformerXL")
    assert "hf:MODEL_TYPE" in hint and "torch.fx can trace" in hint and "your own nn.Sequential" not in hint


def test_a_hugging_face_type_without_its_prefix_is_given_it(pplan):
    _, hint = _refusal(pplan, "profile", "-m", "llama")
    assert "did you mean 'hf:llama'" in hint


def test_positional_files_show_their_format_in_usage(pplan):
    assert "[PLAN.json]" in pplan("calibrate", "--help")[1]
    usage = pplan("hardware", "--help")[1].splitlines()[0]
    assert "[NAME|FILE.json]" in usage and "[[" not in usage


# ---- a file of the right kind, by what it says it is -----------------------------------------

EXAMPLE = Path(__file__).parents[1] / "reports" / "example" / "data"


def _folder_of(tmp_path: Path, *names: str) -> Path:
    """tmp_path/in holding copies of reports/example/data files, each under its own name."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes((EXAMPLE / name).read_bytes())
    return folder


@pytest.mark.parametrize("args, names, suggested", [
    (("simulate", "{dir}"), ("demo.json", "run.json", "sim.json", "plan.json"), "plan.json"),
    (("simulate", PLAN, "--profile", "{dir}"), ("measured_timeline.csv", "timeline.csv", "profile.csv"), "profile.csv"),
    (("simulate", PLAN, "--calibration", "{dir}"), ("demo.json", "plan.json", "profile.calibration.json"),
     "profile.calibration.json"),
    (("report", "--run", "{dir}", "--out", "{dir}/r"), ("plan.json", "run.json"), "run.json"),
])
def test_a_folder_hint_names_a_file_of_the_kind_asked_for(pplan, tmp_path, args, names, suggested):
    folder = _folder_of(tmp_path, *names)
    _, hint = _refusal(pplan, *(str(a).replace("{dir}", str(folder)) for a in args))
    assert f"e.g. {str(folder / suggested)!r}" in hint


@pytest.mark.parametrize("args, words", [
    (("simulate", "{dir}"), "plan JSON"),
    (("partition", "{dir}", "-n", 2, "--global-batch", 8), "profile CSV"),
    (("hardware", "{dir}"), "hardware JSON"),
    (("simulate", PLAN, "--calibration", "{dir}"), "calibration JSON"),
])
def test_a_folder_of_other_files_names_none_of_them(pplan, tmp_path, args, words):
    folder = _folder_of(tmp_path, "demo.json", "measured_timeline.csv", "sim.json")
    (folder / "cluster.json").write_text('{"format": "pplan-cluster/1"}')
    _, hint = _refusal(pplan, *(str(a).replace("{dir}", str(folder)) for a in args))
    assert f"this folder holds no {words}" in hint and str(folder) not in hint


def test_a_folder_hint_reads_a_bounded_number_of_files_named_for_the_kind_first(pplan, tmp_path):
    for i in range(40):
        (tmp_path / f"a{i:02d}.json").write_text("{}")
    os.mkfifo(tmp_path / "a_fifo.json")  # never opened: a read would wait for a writer forever
    (tmp_path / "zz.json").write_bytes(PLAN.read_bytes())  # past the files read, by its name
    _, hint = _refusal(pplan, "simulate", tmp_path)
    assert "no plan JSON among the files of this folder looked at" in hint
    (tmp_path / "my_plan.json").write_bytes(PLAN.read_bytes())  # named for a plan: read first
    _, hint = _refusal(pplan, "simulate", tmp_path)
    assert f"e.g. {str(tmp_path / 'my_plan.json')!r}" in hint


@pytest.mark.parametrize("args, says, reader", [
    (("simulate", PROFILE), f"{PROFILE} is a profile CSV (by its line '# format: pplan-profile/1'), not a plan JSON",
     f"`pplan partition {PROFILE}` reads it"),
    (("simulate", EXAMPLE / "run.json"), "is a run JSON (by its format 'pplan-run/1'), not a plan JSON", "pplan report --run"),
    (("partition", PLAN, "-n", 2, "--global-batch", 8), f"{PLAN} is a plan JSON (by its format 'pplan-plan/1'), not a "
     "profile CSV", f"`pplan simulate {PLAN}` reads it"),
    (("partition", EXAMPLE / "sim.json", "-n", 2, "--global-batch", 8), "is a simulation JSON (by its first key iteration_ms)",
     "pplan report --sim"),
    (("simulate", PLAN, "--profile", EXAMPLE / "profile.calibration.json"), "is a calibration JSON", "--calibration"),
    (("report", "--plan", PROFILE), f"{PROFILE} is a profile CSV (by its line '# format: pplan-profile/1'), not a plan JSON",
     f"`pplan partition {PROFILE}` reads it"),
    (("simulate", EXAMPLE / "timeline.csv"), "is a timeline CSV (by its header 'device,stage,kind,...'), not a plan JSON",
     "pplan report --timeline"),
    (("partition", EXAMPLE / "timeline.csv", "-n", 2, "--global-batch", 8), "is a timeline CSV", "pplan report --timeline"),
])

def test_a_file_of_another_kind_is_named_with_what_reads_it(pplan, tmp_path, args, says, reader):
    message, hint = _refusal(pplan, *args, "-o" if args[0] == "partition" else "--out", tmp_path / "o.json")
    assert says in message and reader in hint
    assert not (tmp_path / "o.json").exists()


def test_the_sniffed_timeline_header_is_the_one_pplan_writes():
    from planner.filekind import TIMELINE_HEADER
    from planner.simulation.result import TIMELINE_COLUMNS

    assert TIMELINE_HEADER == ",".join(TIMELINE_COLUMNS).encode()


def test_a_plan_without_a_format_is_still_a_plan(tmp_path):
    """The format key is optional; a plan's `predicted` record holds iteration_ms and bubble_fraction,
    which once made the sniffer call it a simulation JSON."""
    import json

    from planner.plan import load_plan

    data = json.loads(PLAN.read_text())
    del data["format"]
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert load_plan(tmp_path / "p.json").schedule == load_plan(PLAN).schedule


def test_json_of_no_pplan_kind_given_for_a_profile_is_called_json(pplan, tmp_path):
    (tmp_path / "p.csv").write_text('\n  {"layers": 4}')
    message, hint = _refusal(pplan, "partition", tmp_path / "p.csv", "-n", 2, "--global-batch", 8, "-o", tmp_path / "o.json")
    assert message == f"{tmp_path / 'p.csv'} is JSON, not a profile CSV" and "pplan profile" in hint


def test_the_library_refuses_a_what_if_count_below_one_with_what_to_give():
    from planner.errors import PplanError
    from planner.whatif import WhatIf

    with pytest.raises(PplanError) as e:
        WhatIf(micro_batch_size=0)
    assert e.value.message == "--micro-batch-size 0 must be at least 1" and "e.g. --micro-batch-size 4" in e.value.hint


SPEC = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"


@pytest.fixture(scope="module")
def gpt_profile():
    return analytic_profile(SPEC, load_hardware("h100-80gb"), "float32", [1, 2, 4, 8])


def _infeasible(profile, **kwargs) -> InfeasibleError:
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(profile, hardware="h100-80gb", nodes=1, global_batch=64, memory_bytes=100 * 2**20, **kwargs)
    return e.value


def test_a_forced_layout_that_does_not_fit_is_not_told_about_far_gpu_counts(gpt_profile):
    error = _infeasible(gpt_profile, parallel="dp=8,pp=1,tp=1")
    assert not re.search(r"\d GPUs (do not fit|fit no plan)", error.hint), error.hint
    assert "GPUs with at least" in error.hint  # the fix for this layout: more memory per GPU


def test_one_gpu_is_one_gpu(gpt_profile):
    assert _infeasible(gpt_profile, gpus_per_node=1).message.endswith("on 1 GPU")


@pytest.mark.parametrize("cores, says, not_says", [
    (2, "re-profile with --co-run 1,", "re-profile with --co-run 3"),   # 4 ranks on 2 cores: 1 beside the profiler
    (1, "pplan calibrate", "re-profile with --co-run"),                 # no co-run fits one core
    (16, "re-profile with --co-run 3", "pplan calibrate"),
])
def test_co_run_advice_is_what_pplan_profile_accepts_here(cores, says, not_says):
    advice = co_run_advice(3, 1, cores)
    assert says in advice and not_says not in advice
