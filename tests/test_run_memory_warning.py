"""`pplan run`'s warning for a rank whose measured peak passed its device's limit: with the
`pplan:` prefix every warning has, and by how much (the rounded sizes alone can read equal)."""

from dataclasses import replace
from pathlib import Path

from cli.cmd_run import memory_warnings, print_run
from planner.execute.runfile import load_run

RUN = Path(__file__).resolve().parents[1] / "reports" / "example" / "data" / "run_first.json"


def _run_with_rank1(peak: int, limit: int | None):
    run = load_run(RUN)
    ranks = [replace(r, peak_memory_bytes_measured=peak if r.rank == 1 else 0, memory_limit_bytes=limit)
             for r in run.ranks]
    return run.with_(ranks=ranks)


def test_a_peak_just_over_the_limit_says_how_much_over(capsys):
    # the reviewer's run: 4,724,632 B measured against a 4.5 MiB limit, both printed as 4.5 MiB
    print_run(_run_with_rank1(4_724_632, 4_718_592), out=None, timeline=None)
    lines = [line for line in capsys.readouterr().err.splitlines() if "peaked" in line]
    assert lines == ["pplan: warning: rank 1 peaked at 4.5 MiB (4,724,632 B), 5.9 KiB (0.13%) above its device's "
                     "limit 4.5 MiB (4,718,592 B) in the plan"]


def test_a_peak_within_the_limit_or_without_one_warns_nothing():
    assert memory_warnings(_run_with_rank1(4_718_592, 4_718_592)) == []
    assert memory_warnings(_run_with_rank1(4_724_632, None)) == []
