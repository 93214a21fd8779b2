"""Findings of a --help audit of `pplan` and `pplan bench`: usage errors point at the help of the
command that was invoked, `pplan bench --help` shows each summary whole, and bench options that a
mode never reads are refused instead of ignored. Every command here fails before any bench runs."""

from __future__ import annotations

import json

import pytest

from cli.cmd_bench import BENCH_SUMMARIES


@pytest.mark.parametrize("args, help_of", [
    (["profile", "-m"], "pplan profile"),
    (["bench", "simulator", "--repeats"], "pplan bench simulator"),
    (["bench", "fidelity", "--models"], "pplan bench fidelity"),
    (["bench", "nosuch"], "pplan bench"),
    (["nosuch"], "pplan"),
])
def test_usage_error_names_the_invoked_commands_help(pplan, args, help_of):
    """A missing option value comes from click's parser without a context: the hint still names
    the deepest command on the line, not the root's help."""
    code, out, err = pplan(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.rstrip().endswith(f"see `{help_of} --help`"), err


def test_usage_error_hint_under_json(pplan):
    code, out, err = pplan("bench", "simulator", "--json", "--repeats")
    assert code == 2 and err == ""
    assert json.loads(out)["hint"] == "see `pplan bench simulator --help`"


def _commands_section(text: str) -> list[str]:
    return text.split("Commands:\n", 1)[1].splitlines()


@pytest.mark.parametrize("columns", ["80", "200"])
def test_bench_help_shows_each_summary_whole(pplan, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = pplan("bench", "--help")
    assert code == 0
    lines = [line for line in _commands_section(out) if line.strip()]
    assert len(lines) == len(BENCH_SUMMARIES), out  # one line each: nothing wrapped
    for name, summary in BENCH_SUMMARIES.items():
        assert any(line.split() and line.split()[0] == name and line.rstrip().endswith(summary) for line in lines), out
    assert "..." not in "\n".join(lines) and all(len(line) <= 80 for line in lines)


def test_bench_quality_help_names_its_profiles(pplan, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = pplan("bench", "quality", "--help")
    assert code == 0
    assert "[PROFILE.csv]..." in out.splitlines()[0] and "profiles..." not in out


@pytest.mark.parametrize("models", ["nosuch", "synthetic"])
def test_fidelity_quick_refuses_models(pplan, tmp_path, models):
    """--quick runs its fixed one-group grid, which --models never filtered: a valid group was
    ignored and a typo started runs. Refused before --out-dir is even looked at."""
    out_dir = tmp_path / "bench"
    code, out, err = pplan("bench", "fidelity", "--quick", "--models", models, "--out-dir", out_dir)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"--models '{models}' with --quick" in err and "drop --models" in err, err
    assert not out_dir.exists()


def test_fidelity_help_says_models_is_not_for_quick(pplan, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = pplan("bench", "fidelity", "--help")
    assert code == 0 and "Not with --quick" in " ".join(out.split())


@pytest.mark.parametrize("args, shown", [
    (["--steps", "7"], "--steps 7"),  # was ignored (exit 0)
    (["--steps", "2"], "--steps 2"),  # was refused as steps <= warmup, a setting nothing read
    (["--steps", "5"], "--steps 5"),  # the default, given: still not read
    (["--warmup", "1", "--device", "cuda"], "--warmup 1, --device cuda"),
])
def test_quality_refuses_run_settings_without_measured(pplan, tmp_path, args, shown):
    out_dir = tmp_path / "bench"
    code, out, err = pplan("bench", "quality", *args, "--out-dir", out_dir)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{shown} without --measured" in err and "add --measured" in err, err
    assert not out_dir.exists()


def test_quality_measured_still_checks_its_run_settings(pplan, tmp_path):
    code, _, err = pplan("bench", "quality", "--measured", "--steps", "2", "--warmup", "2", "--out-dir", tmp_path)
    assert code == 2 and "0 <= warmup < steps" in err, err
