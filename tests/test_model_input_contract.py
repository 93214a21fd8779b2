"""The input contract of a factory model (docs/models.md, 'The input contract'): positional
tensors work; a dict batch or a nested tuple is refused naming what it got and what works."""

import pytest
import torch

from planner.errors import ModelSpecError
from planner.models import build_model

from helpers.doc_examples import models_doc_example

DICT_MODEL = '''
import torch
from torch import nn
import torch.nn.functional as F


class DictTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, batch):
        return self.head(self.emb(batch["input_ids"]) * batch["attention_mask"].unsqueeze(-1))


class NestedTagger(DictTagger):
    def forward(self, pair):
        ids, mask = pair
        return self.head(self.emb(ids) * mask.unsqueeze(-1))


def _attach(model, nest):
    def make_batch(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 50, (batch_size, 6), generator=g)
        mask = torch.ones(batch_size, 6)
        x = ((ids, mask),) if nest else {"input_ids": ids, "attention_mask": mask}
        return x, ids % 3

    model.make_batch = make_batch
    model.loss_fn = lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())
    return model


def dict_batch():
    return _attach(DictTagger(), False)


def nested_batch():
    return _attach(NestedTagger(), True)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)

    def forward(self, batch):
        return self.emb(batch["input_ids"])


def sequential_dict_batch():
    return _attach(nn.Sequential(Embed(), nn.Linear(8, 3)), False)
'''


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    (tmp_path / "contract_models.py").write_text(DICT_MODEL)
    (tmp_path / "tagger.py").write_text(models_doc_example("# tagger.py"))
    monkeypatch.chdir(tmp_path)  # a factory module is found in the current directory
    return tmp_path


def build_refusal(spec: str) -> ModelSpecError:
    """The error build_model refuses `spec` with."""
    with pytest.raises(ModelSpecError) as e:
        build_model(spec)
    return e.value


def test_a_dict_batch_is_refused_with_its_keys_and_what_works(models_dir):
    error = build_refusal("contract_models:dict_batch")
    assert error.message == ("model 'contract_models:dict_batch': DictTagger.forward's input 0 is a dict "
                             "(keys 'input_ids', 'attention_mask'): a pipeline stage passes its inputs as positional tensors")
    assert "forward(self, input_ids, attention_mask)" in error.hint
    assert "((input_ids, attention_mask), target)" in error.hint and "docs/models.md" in error.hint


def test_a_nested_tuple_is_refused_too(models_dir):
    with pytest.raises(ModelSpecError, match=r"NestedTagger.forward's input 0 is a tuple of 2: a pipeline stage"):
        build_model("contract_models:nested_batch")


def test_an_nn_sequential_given_a_dict_batch_is_refused_in_one_line(models_dir):
    error = build_refusal("contract_models:sequential_dict_batch")
    assert error.message == ("model 'contract_models:sequential_dict_batch': make_batch gives a dict (keys "
                             "'input_ids', 'attention_mask') as the input of an nn.Sequential, which takes one tensor")
    assert "forward(self, input_ids, attention_mask)" in error.hint


def test_the_documented_positional_inputs_build_and_train(models_dir):
    bundle = build_model("tagger:build")
    x, target = bundle.make_batch(4, 0)
    assert [t.shape for t in x] == [(4, 12), (4, 12)]
    out = bundle.layers(x)  # the pipeline's layers take the input tuple as one
    loss = bundle.loss_fn(out, target)
    loss.backward()
    assert torch.isfinite(loss) and len(bundle.layers) >= 2
