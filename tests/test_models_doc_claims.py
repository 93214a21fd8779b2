"""The layer names docs/models.md promises are the ones `pplan profile` prints and records.

The names are parsed out of the document (a list of backticked names, `a.0` .. `a.3` standing
for the run between them), so a change of either the tool's naming or the document's text that
makes them disagree fails here. Covered: the `nn.TransformerEncoder` example of "Which layers a
traced module gets" and its known limitation, the BERT classifier wrapper and the BART
encoder-decoder wrapper of "A wrapper over a model's submodules", and the refusal of the `hf:`
encoder-decoder specs that section points to.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.profiling.profile import load_profile

from helpers.doc_examples import MODELS_DOC, models_doc_example

NAME_LIST = r"((?:`[^`]+`(?:,\s+|\s+\.\.\s+))*`[^`]+`)"
"""A run of backticked names separated by ', ' or ' .. ' (the document wraps lines anywhere)."""

ENCODER = '''
from torch import nn


class Encoder(nn.Module):
    def __init__(self, depth, own_loop):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(32, 4)
        self.own_loop = own_loop

    def forward(self, x):
        h = self.inp(x)
        if self.own_loop:  # the workaround the document gives: the blocks called at the top level
            for layer in self.encoder.layers:
                h = layer(h)
        else:
            h = self.encoder(h)
        return self.head(h)


def build(depth=6, own_loop=False):
    return Encoder(depth, own_loop)
'''


def _doc() -> str:
    return MODELS_DOC.read_text(encoding="utf-8")


def _expand(name_list: str) -> list[str]:
    """`a`, `b.0` .. `b.2`, `c` -> [a, b.0, b.1, b.2, c]."""
    names: list[str] = []
    for first, last in re.findall(r"`([^`]+)`(?:\s+\.\.\s+`([^`]+)`)?", name_list):
        if not last:
            names.append(first)
            continue
        a, b = re.fullmatch(r"(.*?)(\d+)", first), re.fullmatch(r"(.*?)(\d+)", last)
        assert a and b and a[1] == b[1], f"docs/models.md: cannot expand `{first}` .. `{last}`"
        names += [f"{a[1]}{i}" for i in range(int(a[2]), int(b[2]) + 1)]
    return names


def _doc_names(before: str, text: str | None = None) -> list[str]:
    """The names docs/models.md lists right after the regex `before`."""
    found = re.findall(before + NAME_LIST, text if text is not None else _doc())
    assert len(found) == 1, f"docs/models.md: {len(found)} name lists after {before!r}, not one"
    return _expand(found[0])


def _printed_names(stdout: str) -> list[str]:
    """The name column of `pplan profile`'s per-layer table."""
    return re.findall(r"^\s+\d+\s+(\S+)\s", stdout, flags=re.M)


def _profile(pplan, spec: str, *extra: str) -> tuple[list[str], list[str], Path]:
    """(names printed, names recorded in the CSV, the CSV) of a one-repeat profile of `spec`."""
    code, out, err = pplan("profile", "--model", spec, *extra, "-b", "1", "--warmup", "0", "--repeats", "1",
                           "-o", "doc.csv")
    assert code == 0, err
    return _printed_names(out), list(load_profile("doc.csv").names), Path("doc.csv")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_expand_reads_ranges_and_single_names():
    assert _expand("`embeddings`, `layers.0` .. `layers.2`,\n`pooler`") == ["embeddings", "layers.0", "layers.1",
                                                                           "layers.2", "pooler"]


def test_a_transformer_encoder_becomes_the_blocks_the_doc_names(pplan, folder):
    found = re.findall(r"`self\.encoder = nn\.TransformerEncoder\(layer, (\d+)\)` becomes\s+", _doc())
    assert len(found) == 1, "docs/models.md no longer shows the nn.TransformerEncoder example"
    blocks = _doc_names(r"`self\.encoder = nn\.TransformerEncoder\(layer, \d+\)` becomes\s+")
    (folder / "doc_encoder.py").write_text(ENCODER)
    printed, recorded, _ = _profile(pplan, f"doc_encoder:build:depth={found[0]}", "--input-shape", "8,16")
    assert printed == recorded == ["inp", *blocks, "head"]


def test_a_deep_container_splits_into_its_blocks_as_its_own_loop_does(pplan, folder):
    """12 equal blocks, each a twelfth of the weights, stayed one layer `encoder` under the rule
    "two parts hold a tenth each" (planner.graph.balance); now each block is a layer, as the doc says."""
    deep = ["inp", *(f"encoder.layers.{i}" for i in range(12)), "head"]
    assert "`inp`, `encoder.layers.0` .. `encoder.layers.11`, `head`" in _doc()
    (folder / "doc_deep_encoder.py").write_text(ENCODER)
    printed, recorded, _ = _profile(pplan, "doc_deep_encoder:build:depth=12", "--input-shape", "8,16")
    assert printed == recorded == deep
    printed, recorded, _ = _profile(pplan, "doc_deep_encoder:build:depth=12,own_loop=true", "--input-shape", "8,16")
    assert printed == recorded == deep


def test_the_bert_classifier_wrapper_prints_the_names_the_doc_gives(pplan, folder):
    pytest.importorskip("transformers")
    doc_names = _doc_names(r"Its layers, as `pplan profile`, `partition` and `simulate` print them, are\s+")
    (folder / "doc_bert_cls.py").write_text(models_doc_example("# bert_cls.py"))
    printed, recorded, _ = _profile(pplan, "doc_bert_cls:build")  # the defaults the document's names are for
    assert printed == recorded == doc_names


def test_the_bart_wrapper_prints_the_names_and_skip_edges_the_doc_gives(pplan, folder):
    pytest.importorskip("transformers")
    after_example = _doc().split("# bart_seq2seq.py", 1)[1]
    doc_names = _doc_names(r"Its layers are\s+", after_example.split("```", 2)[1])
    (folder / "doc_bart.py").write_text(models_doc_example("# bart_seq2seq.py"))
    printed, recorded, csv = _profile(pplan, "doc_bart:build")
    assert printed == recorded == doc_names
    # "the encoder's output, from `enc_layers.1` to both decoder layers, and `decoder_input_ids`,
    # from the first layer to the decoder's"
    index = {name: i for i, name in enumerate(recorded)}
    readers = {edge.src: {edge.dst, *edge.also_to} for edge in load_profile(csv).skip_edges}
    decoder = {i for name, i in index.items() if name.startswith("dec_layers.")}
    assert len(readers) == 2 and decoder <= readers[index["enc_layers.1"]] and decoder <= readers[0]


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_the_hf_encoder_decoder_specs_are_refused_in_one_line(pplan, folder, family):
    pytest.importorskip("transformers")
    code, _, err = pplan("profile", "--model", f"hf:{family}", "-o", "x.csv")
    assert code == 2 and "encoder-decoder" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0, err
    assert not Path("x.csv").exists()
