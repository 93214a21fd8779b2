"""docs/models.md's 'A wrapper over a model's submodules': its BERT classifier example profiles
into one layer per submodule, plans on 2 devices and trains; a wrapper calling the model whole
gives one layer, which `pplan profile` warns about."""

import pytest

from planner.models import build_model
from planner.models.factory import few_layers_warning

from helpers.doc_examples import models_doc_example

pytest.importorskip("transformers")

ONE_LAYER = '''
from torch import nn
from transformers import BertConfig, BertForSequenceClassification


class Whole(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                                          num_attention_heads=2, intermediate_size=32, num_labels=3))

    def forward(self, input_ids):
        return self.m(input_ids=input_ids).logits


def build():
    return Whole()
'''


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    (tmp_path / "bert_cls.py").write_text(models_doc_example("# bert_cls.py"))
    (tmp_path / "whole.py").write_text(ONE_LAYER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_wrapper_gives_one_layer_per_submodule(models_dir):
    bundle = build_model("bert_cls:build:layers=2,hidden=32,seq=8")
    names = [name for name, _ in bundle.layers.named_children()]
    assert names == ["embeddings", "layers_0", "layers_1", "pooler", "classifier"], names
    assert few_layers_warning(len(names), names) is None


def test_a_wrapper_calling_the_model_whole_is_one_layer_and_warned(models_dir):
    bundle = build_model("whole:build", input_shape=(8,), input_dtype="long", vocab=64)
    names = [name for name, _ in bundle.layers.named_children()]
    assert names == ["m"]
    assert few_layers_warning(1, names) == (
        "the model gave 1 layer ('m'): a pipeline cuts between layers, so it plans on 1 device only; return a module "
        "whose forward calls the model's submodules (embeddings, each block, the head) so each is a layer "
        "(docs/models.md, 'A wrapper over a model's submodules')")


@pytest.mark.slow
def test_the_documented_wrapper_profiles_plans_and_runs_on_two_devices(pplan, models_dir):
    model = "bert_cls:build:layers=2,hidden=32,seq=8"
    code, _, err = pplan("profile", "--model", model, "-b", "2", "--warmup", "1", "--repeats", "2", "-o", "b.csv")
    assert code == 0, err
    assert "warning" not in err
    code, _, err = pplan("partition", "b.csv", "--devices", "2", "--global-batch", "8", "--out", "b.json")
    assert code == 0, err
    code, out, err = pplan("run", "b.json", "--model", model, "--steps", "2", "--threads", "1")
    assert code == 0, err
    assert "loss:" in out


@pytest.mark.slow
def test_a_one_layer_profile_is_warned_and_partition_says_why(pplan, models_dir):
    code, _, err = pplan("profile", "--model", "whole:build", "--input-shape", "8", "--input-dtype", "long",
                         "--vocab", "64", "-b", "2", "--warmup", "0", "--repeats", "1", "-o", "w.csv")
    assert code == 0, err
    assert "pplan: warning: the model gave 1 layer ('m'): a pipeline cuts between layers" in err
    code, _, err = pplan("partition", "w.csv", "--devices", "2", "--global-batch", "8", "--out", "w.json")
    assert code == 2
    assert "2 devices but the profile has 1 layer: there is no cut to place" in err and "--devices 1 or fewer" not in err
