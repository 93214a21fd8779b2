"""A newcomer's path through the CLI: every refusal says what to give instead (a hint), --help
describes what is accepted, and a suggestion is one the next command accepts."""

from __future__ import annotations

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
    (tmp_path / "gpt.csv").write_text("not read\n")
    (tmp_path / "notes.txt").write_text("")
    message, hint = _refusal(pplan, "partition", tmp_path, "-n", 2, "--global-batch", 8, "-o", tmp_path / "p.json")
    assert "is a directory" in message and str(tmp_path / "gpt.csv") in hint
    assert not (tmp_path / "p.json").exists()


def test_an_empty_folder_given_for_a_plan_says_it_holds_none(pplan, tmp_path):
    message, hint = _refusal(pplan, "simulate", tmp_path)
    assert message.startswith("plan ") and "is a directory" in message and "holds none" in hint


def test_a_batch_of_no_samples_says_what_to_give(pplan, tmp_path):
    message, hint = _refusal(pplan, "partition", PROFILE, "-n", 2, "--global-batch", 0, "-o", tmp_path / "p.json")
    assert "--global-batch must be at least 1, got 0" in message and "--global-batch 64" in hint
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
