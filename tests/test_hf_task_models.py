"""Hugging Face task models a newcomer brings: a classification key on a language model, a task
class from a factory, an encoder-decoder from a factory; each refused in one line saying what
works instead."""

import pytest

from planner.errors import ModelSpecError
from planner.models import build_model

pytest.importorskip("transformers")

TINY_BERT = "hf:bert:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,intermediate_size=32,vocab_size=64"

FACTORIES = '''
from torch import nn


def bert_cls():
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))


def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1,
                                               num_decoder_layers=1, num_heads=2, d_kv=8))
'''


@pytest.mark.parametrize("keys,named", [("num_labels=3", "num_labels is"),
                                        ("num_labels=2,problem_type=single_label_classification",
                                         "num_labels, problem_type are")])
def test_a_classification_key_on_a_language_model_is_refused_naming_the_task_built(keys, named):
    with pytest.raises(ModelSpecError) as e:
        build_model(f"{TINY_BERT},{keys}", input_shape=(8,))
    assert e.value.message.endswith(f": {named} read by a classification head, but pplan builds the masked LM "
                                    "(BertForMaskedLM), which has none")
    assert "A wrapper over a model's submodules" in e.value.hint


def test_an_image_classifier_reads_num_labels():
    bundle = build_model("hf:vit:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,intermediate_size=32,"
                         "image_size=8,patch_size=4,num_labels=5")
    assert bundle.layers.source.config.num_labels == 5


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "hf_factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)


def test_a_task_class_from_a_factory_points_at_hf_and_the_wrapper(factories):
    with pytest.raises(ModelSpecError) as e:
        build_model("hf_factories:bert_cls", input_shape=(8,), input_dtype="long", vocab=64)
    assert "torch.fx cannot trace BertForSequenceClassification.forward" in e.value.message
    assert e.value.hint.startswith("BertForSequenceClassification is a Hugging Face model, whose forward fx cannot "
                                   "trace: use hf:bert ")
    assert "A wrapper over a model's submodules" in e.value.hint and "if or loop" not in e.value.hint


def test_an_encoder_decoder_from_a_factory_is_refused_as_hf_t5_is(factories):
    with pytest.raises(ModelSpecError) as e:
        build_model("hf_factories:t5", input_shape=(8,), input_dtype="long", vocab=64)
    assert e.value.message == ("model 'hf_factories:t5': T5ForConditionalGeneration is an encoder-decoder model (two "
                               "stacks of blocks, the decoder's reading the encoder's output), not the one stack of "
                               "layers pplan cuts")
    assert "'Encoder-decoder models'" in e.value.hint  # the docs' wrapper recipe
    with pytest.raises(ModelSpecError, match="is an encoder-decoder model"):
        build_model("hf:t5:num_layers=1,d_model=16,d_ff=32,num_heads=2,d_kv=8,vocab_size=64", input_shape=(8,))
