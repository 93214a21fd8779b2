"""The console examples of README.md and docs/ print what they show.

Each case runs a `$ pplan ...` line exactly as the documentation writes it, in a folder that
holds the files it names (the committed reference profiles under profiles/, the sample plan of
tests/data), and checks that every output line the documentation shows is printed, in that
order (`...` marks what the documentation cuts). Planning and simulation are deterministic, so
a change that moves a documented number, or a re-measured reference profile, fails here until
the documentation says the new figure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.doc_examples import command_words, console_example, missing_from_output

ROOT = Path(__file__).resolve().parents[1]
GPT = "profiles/gpt-8l-v32k.csv"

_GPT175B = ("pplan profile --analytic --model gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200 "
            "--hardware a100-80gb --dtype bfloat16 -b 1,2,4,8 -o gpt175b.csv")
_LAYOUTS = ("pplan partition gpt175b.csv --nodes 192 --gpus-per-node 8 --hardware a100-80gb --global-batch 1536 "
            "--out gpt175b-plan.json --plot layouts.png   # --parallel dp=32,pp=6,tp=8 forces a layout; --zero 1; "
            "--schedule 1f1b --microbatches 32 hold the search")
# Options left out when a case runs: drawing every layout's point adds ~19 s and is not what is compared.
_NOT_RUN = {"--plot": "layouts.png"}

# (document, the console line as shown, commands it depends on, run first in the same folder)
CASES = [
    ("README.md", "pplan partition gpt.csv --devices 4 --memory 200MiB --global-batch 32 --out plan.json", []),
    ("README.md", "pplan simulate plan.json --plot gantt.png              "
     "# what-if: --schedule zb, --microbatches 16, --bandwidth 10GB/s",
     ["pplan partition gpt.csv --devices 4 --memory 200MiB --global-batch 32 --out plan.json"]),
    ("README.md", "pplan simulate plan.json --sweep microbatches=4,8,16,32   # global batch 32 kept, as partition does",
     ["pplan partition gpt.csv --devices 4 --memory 200MiB --global-batch 32 --out plan.json"]),
    ("docs/planner.md", f"pplan partition {GPT} --devices 4 --memory 200MiB --global-batch 32", []),
    ("docs/planner.md", f"pplan partition {GPT} --cluster examples/cluster.json --global-batch 32", []),
    ("README.md", _LAYOUTS, [_GPT175B]),
    ("docs/simulator.md", "pplan simulate tests/data/sim_plan.json --profile tests/data/sim_profile.csv --plot gantt.png",
     []),
    ("docs/simulator.md", "pplan simulate tests/data/sim_plan.json --profile tests/data/sim_profile.csv "
     "--sweep schedule=gpipe,1f1b,zb", []),
]


@pytest.fixture
def doc_folder(tmp_path: Path, monkeypatch) -> Path:
    """A working folder holding what the examples name: profiles/, examples/, tests/data's sample plan and
    profile, and gpt.csv (README's own profile, shown with the committed gpt profile's numbers)."""
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "tests" / "data").mkdir(parents=True)
    for name in ("sim_plan.json", "sim_profile.csv"):
        shutil.copy(ROOT / "tests" / "data" / name, tmp_path / "tests" / "data" / name)
    shutil.copy(ROOT / GPT, tmp_path / "gpt.csv")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc, command, before", CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(CASES)])
def test_console_example_prints_what_the_docs_show(pplan, doc_folder, doc, command, before):
    shown = console_example(doc, command)
    assert [line for line in shown if line.strip() not in ("", "...")], f"{doc} shows no output for `{command}`"
    for earlier in before:
        code, _, err = pplan(*command_words(earlier))
        assert code == 0, err
    words = command_words(command)
    for option, value in _NOT_RUN.items():
        if option in words and words[words.index(option) + 1] == value:
            del words[words.index(option):words.index(option) + 2]
    code, out, err = pplan(*words)
    assert code == 0, err
    missing = missing_from_output(shown, out, err)
    assert not missing, f"{doc}: `{command}` no longer prints these lines (in this order):\n" + "\n".join(missing) \
        + "\n--- it printed:\n" + out + err


def _plan_naming(model: str):
    """Setup: plan.json for profiles/mlp.csv with its model string replaced by `model`."""
    def make(pplan, folder: Path) -> None:
        code, _, err = pplan("partition", "profiles/mlp.csv", "--devices", 2, "--global-batch", 32, "--out", "plan.json")
        assert code == 0, err
        if model:
            plan = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
            (folder / "plan.json").write_text(json.dumps({**plan, "model": model}, indent=2), encoding="utf-8")
    return make


# (document, the console line as shown, what the folder needs first): the error lines the docs
# show (wrapped over several lines where the docs say so) are the one line printed, exit code 2
ERROR_CASES = [
    ("docs/planner.md", f"pplan partition {GPT} --devices 4 --memory 100MiB --global-batch 32", None),
    ("docs/models.md", "pplan profile --model gpt:layer=4", None),
    ("docs/models.md", "pplan run plan.json --input-shape 3,32,32", _plan_naming("")),
    ("docs/models.md", "pplan run plan.json", _plan_naming("mymodels:build:width=512")),
]


@pytest.mark.parametrize("doc, command, setup", ERROR_CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(ERROR_CASES)])
def test_error_example_is_the_one_line_printed(pplan, doc_folder, doc, command, setup):
    if setup is not None:
        setup(pplan, doc_folder)
    before = sorted(p.name for p in doc_folder.iterdir())
    shown = [line for line in console_example(doc, command) if line.strip()]
    assert shown and shown[0].startswith("pplan: error: "), f"{doc} shows no error for `{command}`"
    code, out, err = pplan(*command_words(command))
    assert code == 2 and out == ""
    assert " ".join(line.strip() for line in shown) == err.strip()
    assert sorted(p.name for p in doc_folder.iterdir()) == before  # no partial file


def test_missing_lines_are_found():
    """The comparison can fail: a changed figure, a line out of order, a line not printed."""
    out = "a  1\n-----\nb 2\nc 3\n"
    assert missing_from_output(["a 1", "...", "c   3"], out) == []
    assert missing_from_output(["a 1", "c 4"], out) == ["c 4"]
    assert missing_from_output(["c 3", "a 1"], out) == ["a 1"]
    assert missing_from_output(["w", "a 1", "x", "c 3"], out, "w\nx\n") == []  # stderr's lines anywhere, in their order
    assert missing_from_output(["x", "w"], out, "w\nx\n") == ["w"]
