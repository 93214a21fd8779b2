"""The profile CSV loader: the documented example loads, every kind of bad file is refused."""

import re
from pathlib import Path

import numpy as np
import pytest

from planner.errors import ProfileError
from planner.profiling.profile import FORMAT, load_profile, make_profile, read_profile_text, write_profile

from helpers.profiles import profile_csv

DOC = Path(__file__).resolve().parents[1] / "docs" / "profile-format.md"
# two layers at micro-batch sizes 1 and 2: text lines 3 to 6 (0-based) are the rows
GOOD = profile_csv({"input_bytes_per_sample": 16}, ["0,a,1,1.0,2.0,100,10,4", "0,a,2,2.0,4.0,100,20,8",
                                                   "1,b,1,1.5,3.0,50,12,4", "1,b,2,3.0,6.0,50,24,8"])


def _doc_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```csv\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/profile-format.md lost its ```csv example"
    return blocks[0]


def test_documented_example_loads(tmp_path):
    path = tmp_path / "example.csv"
    path.write_text(_doc_example(), encoding="utf-8")
    p = load_profile(path)
    assert p.names == ("fc0", "head") and p.micro_batch_sizes == (1, 8)
    assert p.meta["model"] == "mlp:layers=2" and p.input_bytes_per_sample == 3136
    costs = p.at(8)
    assert list(costs.fwd_ms) == [2.0, 0.6] and list(costs.bwd_input_ms) == [2.0, 0.6]
    assert costs.input_bytes == 8 * 3136 and not costs.interpolated


def test_good_profile_round_trips_with_optional_columns(tmp_path):
    p = read_profile_text(GOOD)
    cols = {c: p.columns[c] for c in ("fwd_ms", "bwd_ms", "param_bytes", "activation_bytes", "output_bytes")}
    cols["shared_input_bytes"] = np.array([[0, 0], [4, 8]])
    cols["bwd_input_ms"] = np.array([[0, 0], [1, 2]])
    q = make_profile(list(p.names), list(p.micro_batch_sizes), cols, {"model": "x"})
    write_profile(q, tmp_path / "q.csv")
    r = load_profile(tmp_path / "q.csv")
    assert r.present == {"shared_input_bytes", "bwd_input_ms"}
    assert r.columns["shared_input_bytes"].tolist() == [[0, 0], [4, 8]]
    assert r.columns["bwd_weight_ms"].tolist() == [[2, 4], [2, 4]]  # bwd - bwd_input
    assert list(r.at(2).shared_input_bytes) == [0, 8]
    assert r.meta["format"] == FORMAT


def _replace_cell(text: str, line: int, column: str, value: str) -> str:
    lines = text.splitlines()
    header = lines[2].split(",")
    cells = lines[line].split(",")
    cells[header.index(column)] = value
    lines[line] = ",".join(cells)
    return "\n".join(lines) + "\n"


BAD_TEXT = {
    "missing column": (GOOD.replace(",activation_bytes", "").replace(",10,4", ",4").replace(",20,8", ",8").replace(",12,4", ",4").replace(",24,8", ",8"), ["missing column", "activation_bytes"]),
    "non-numeric": (_replace_cell(GOOD, 3, "fwd_ms", "fast"), ["fwd_ms", "'fast'", "not a number", ":4"]),
    "negative": (_replace_cell(GOOD, 4, "bwd_ms", "-1"), ["bwd_ms", "negative", ":5"]),
    "inf": (_replace_cell(GOOD, 5, "output_bytes", "inf"), ["output_bytes", "finite"]),
    "nan": (_replace_cell(GOOD, 6, "activation_bytes", "nan"), ["activation_bytes", "finite"]),
    "missing size": ("\n".join(GOOD.splitlines()[:-1]) + "\n", ["layer 1", "micro_batch_size 2"]),
    "gap in layers": (GOOD.replace("\n1,b,", "\n2,b,"), ["layer index 1 is missing"]),
    "duplicate row": (GOOD + "1,b,2,3.0,6.0,50,24,8\n", ["duplicate row", "layer 1", "micro_batch_size 2"]),
    "non-integer layer": (_replace_cell(GOOD, 3, "layer", "0.5"), ["layer", "not an integer"]),
    "size zero": (_replace_cell(GOOD, 3, "micro_batch_size", "0"), ["micro_batch_size", "below 1"]),
    "renamed layer": (_replace_cell(GOOD, 4, "name", "z"), ["named 'z'"]),
    "param bytes vary": (_replace_cell(GOOD, 4, "param_bytes", "101"), ["different param_bytes"]),
    "short row": (GOOD + "1,b,4,1\n", ["fields"]),
    "only comments": ("# format: pplan-profile/1\n\n", ["empty profile"]),
    "header only": (GOOD.splitlines()[2] + "\n", ["no data rows"]),
    "wrong format": (GOOD.replace(FORMAT, "pplan-profile/9"), ["pplan-profile/9", "not supported"]),
    "duplicate column": (GOOD.replace("output_bytes", "output_bytes,fwd_ms").replace(",4\n", ",4,1\n").replace(",8\n", ",8,1\n"), ["duplicated column", "fwd_ms"]),
    # sizes are bounded by what the file holds: one absurd index is refused at its line
    "layer index 1e9": (GOOD + "1000000000,x,1,1,1,1,1,1\n", [":8:", "layer index 1000000000", "beyond the file's 5 data row(s)"]),
    "layer index past the rows": (GOOD + "9,x,1,1,1,1,1,1\n", [":8:", "layer 9 but layer index 2 is missing", "5 data row(s)"]),
    "micro-batch 1e12": (_replace_cell(GOOD, 3, "micro_batch_size", "1000000000000"), [":4:", "micro_batch_size", "larger than any micro-batch"]),
    # metadata is validated like the columns, with its line
    "meta input_bytes inf": (GOOD.replace("input_bytes_per_sample: 16", "input_bytes_per_sample: inf"), [":2:", "'input_bytes_per_sample'", "'inf'", "finite"]),
    "meta input_bytes nan": (GOOD.replace("input_bytes_per_sample: 16", "input_bytes_per_sample: nan"), [":2:", "'nan'", "finite"]),
    "meta input_bytes -1": (GOOD.replace("input_bytes_per_sample: 16", "input_bytes_per_sample: -1"), [":2:", "'-1'", ">= 0"]),
    "meta input_bytes text": (GOOD.replace("input_bytes_per_sample: 16", "input_bytes_per_sample: lots"), [":2:", "'lots'", "not a number"]),
    "meta input_shape": (GOOD.replace("# input_bytes", "# input_shape: 3,x\n# input_bytes"), [":2:", "'input_shape'", "'3,x'"]),
    "meta input_shape zero": (GOOD.replace("# input_bytes", "# input_shape: 3,0\n# input_bytes"), [":2:", "'input_shape'", "at least 1"]),
    "meta input_shape huge": (GOOD.replace("# input_bytes", "# input_shape: 100000,100000\n# input_bytes"), [":2:", "elements per sample"]),
    "meta input_dtype": (GOOD.replace("# input_bytes", "# input_dtype: half\n# input_bytes"), [":2:", "'half'", "float, long"]),
    "meta vocab": (GOOD.replace("# input_bytes", "# vocab: -3\n# input_bytes"), [":2:", "'vocab'", "out of range"]),
    "meta seed -5": (GOOD.replace("# input_bytes", "# seed: -5\n# input_bytes"), [":2:", "'seed'", "'-5'", "out of range"]),
    "meta seed text": (GOOD.replace("# input_bytes", "# seed: zero\n# input_bytes"), [":2:", "'seed'", "not an integer"]),
    "meta elapsed_s": (GOOD.replace("# input_bytes", "# elapsed_s: soon\n# input_bytes"), [":2:", "'elapsed_s'", "not a number"]),
    "meta unknown key": (GOOD.replace("# input_bytes", "# seeed: 3\n# input_bytes"), [":2:", "unknown metadata key 'seeed'", "did you mean 'seed'"]),
    "meta key twice": (GOOD.replace("# input_bytes_per_sample: 16", "# input_bytes_per_sample: 16\n# input_bytes_per_sample: 17"), [":3:", "given twice", "first on line 2"]),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_bad_profiles_get_one_line_errors(tmp_path, case):
    text, words = BAD_TEXT[case]
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = info.value.one_line()
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("content, words", [
    (b"", ["empty profile"]),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["binary"]),
    (b"layer,name\n\xff\xfe bad", ["not UTF-8"]),
])
def test_empty_binary_and_non_utf8_files(tmp_path, content, words):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    for word in words:
        assert word in info.value.one_line()


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.csv")
    with pytest.raises(ProfileError, match="directory"):
        load_profile(tmp_path)


CLI_CASES = {**{k: v[0].encode() for k, v in BAD_TEXT.items()}, "empty": b"", "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_bad_profile_on_the_command_line(tmp_path, pplan, case):
    """What a user sees: `pplan partition BAD.csv` exits 2 with one line and writes no plan."""
    bad = tmp_path / "bad.csv"
    bad.write_bytes(CLI_CASES[case])
    plan = tmp_path / "plan.json"
    code, out, err = pplan("partition", bad, "--devices", "2", "--global-batch", "8", "--out", plan)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pplan: error:") and str(bad) in lines[0], err
    assert not plan.exists()


REFERENCE = sorted((Path(__file__).resolve().parents[1] / "profiles").glob("*.csv"))


@pytest.mark.parametrize("path", REFERENCE, ids=[p.name for p in REFERENCE])
def test_reference_profiles_load_match_their_model_and_are_documented(path):
    from planner.models import build_model

    p = load_profile(path)
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    assert p.meta["command"] in readme, "profiles/README.md must give the exact command"
    assert p.micro_batch_sizes[-1] >= 32 and float(p.meta["input_bytes_per_sample"]) > 0
    layers = build_model(p.meta["model"], seed=int(p.meta["seed"])).layers
    assert p.names == tuple(n for n, _ in layers.named_children())
    assert p.columns["param_bytes"][:, 0].tolist() == [sum(t.numel() * 4 for t in m.parameters()) for _, m in layers.named_children()]


def test_there_are_reference_profiles():
    assert len(REFERENCE) >= 5


def test_comment_lines_without_a_colon_are_ignored():
    p = read_profile_text(GOOD.replace("# input_bytes", "# measured on Tuesday, by hand\n#\n# input_bytes"))
    assert p.input_bytes_per_sample == 16 and set(p.meta) == {"format", "input_bytes_per_sample"}


def test_every_metadata_key_pplan_writes_loads(tmp_path):
    """The profiler's keys (a factory model's input description too) and the generators' keys."""
    from planner.partition.synthetic import imbalanced

    meta = {"model": "mymodels:build:width=8", "seed": "3", "device": "cpu", "device_name": "Some CPU", "dtype": "float32",
            "torch": "2.5.0", "threads": "1", "date": "2026-01-01T00:00:00Z", "command": "pplan profile -m mymodels:build",
            "input_bytes_per_sample": "16", "warmup": "1", "repeats": "3", "timer": "wall", "input_shape": "4",
            "input_dtype": "float", "vocab": "", "elapsed_s": "1.5", "source": "x", "analytic": "true", "hardware": "h200"}
    p = read_profile_text(GOOD)
    q = make_profile(list(p.names), list(p.micro_batch_sizes), dict(p.columns), meta)
    write_profile(q, tmp_path / "q.csv")
    assert load_profile(tmp_path / "q.csv").meta == {"format": FORMAT, **meta}
    assert imbalanced(8).meta["source"].startswith("planner.partition.synthetic")


COMMITTED = sorted({*(Path(__file__).resolve().parents[1] / "profiles").glob("*.csv"), *(Path(__file__).parent / "data").glob("*profile*.csv"),
                    Path(__file__).parent / "data" / "report" / "profile.csv", Path(__file__).parent / "data" / "bad" / "good_profile.csv"})


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_profiles_still_load(path):
    assert load_profile(path).n_layers >= 1


def test_many_micro_batch_sizes_load_in_linear_time():
    """50,000 sizes took 77 s (a list scan per row and column); dict lookups make it linear."""
    n = 50_000
    rows = ["layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes"]
    rows += [f"0,a,{s},{s},{2 * s},100,{s},{s}" for s in range(n, 0, -1)]  # any order
    p = read_profile_text("\n".join(rows) + "\n")
    assert p.micro_batch_sizes[:3] == (1, 2, 3) and len(p.micro_batch_sizes) == n
    assert p.at(777).fwd_ms[0] == 777 and not p.at(777).interpolated
    assert p.at(2 * n).fwd_ms[0] == 2 * n  # proportional beyond the largest


def test_interpolation_between_measured_sizes():
    p = read_profile_text(GOOD.replace(",2,2.0,4.0,", ",4,2.0,4.0,").replace(",2,3.0,6.0,", ",4,3.0,6.0,"))
    costs = p.at(3)
    assert costs.interpolated and costs.fwd_ms.tolist() == pytest.approx([1 + 2 / 3, 2.5])


def test_the_layer_limit_is_what_the_docs_say():
    from planner.profiling.profile import MAX_LAYERS

    assert f"more than {MAX_LAYERS:,} layers" in DOC.read_text(encoding="utf-8")
    header = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n"
    at_limit = header + "".join(f"{i},l{i},1,1,2,10,1,1\n" for i in range(MAX_LAYERS))
    assert read_profile_text(at_limit).n_layers == MAX_LAYERS
    with pytest.raises(ProfileError, match=f"<profile>:{MAX_LAYERS + 2}: layer index {MAX_LAYERS} means more than {MAX_LAYERS} layers"):
        read_profile_text(at_limit + f"{MAX_LAYERS},x,1,1,2,10,1,1\n")


def test_edge_lines_are_bounded_by_the_layer_count():
    from planner.graph.edges import MAX_EDGES_PER_LAYER

    n = 20
    header = "layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes\n"
    rows = "".join(f"{i},l{i},1,1,2,10,1,1\n" for i in range(n))
    edges = [f"# edge: {s}->{d} 4\n" for s in range(n) for d in range(s + 2, n)]
    assert len(edges) > MAX_EDGES_PER_LAYER * n
    ok = "".join(edges[:MAX_EDGES_PER_LAYER * n])
    assert len(read_profile_text(ok + header + rows).skip_edges) == MAX_EDGES_PER_LAYER * n
    with pytest.raises(ProfileError, match=f"<profile>:{MAX_EDGES_PER_LAYER * n + 1}: more than {MAX_EDGES_PER_LAYER * n} edge lines for {n} layers"):
        read_profile_text("".join(edges) + header + rows)


def test_a_size_outside_the_measured_ones_is_called_extrapolated_not_interpolated():
    p = read_profile_text(profile_csv({}, ["0,a,2,1.0,2.0,100,10,4", "0,a,4,2.0,4.0,100,20,8"]))
    assert [p.size_basis(b) for b in (2, 3, 1, 32)] == ["measured", "interpolated", "extrapolated", "extrapolated"]
    assert p.size_note(32) == "costs extrapolated from the measured sizes 2, 4" and p.size_note(4) == ""
    assert p.size_note(3) == "costs interpolated from the measured sizes 2, 4"
