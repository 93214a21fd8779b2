"""An hf: config key that is not the model type's own is refused naming the nearest accepted keys,
the older ones transformers converts included (llama's rope_theta, filed in rope_parameters)."""

from __future__ import annotations

import pytest

from planner.errors import ModelSpecError
from planner.models import build_model

pytest.importorskip("transformers")

TINY_LLAMA = "hf:llama:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,num_key_value_heads=1,intermediate_size=32,vocab_size=64"


def test_a_typo_of_a_converted_key_names_it_and_no_name_the_config_ignores():
    with pytest.raises(ModelSpecError, match=r"'rope_thetta' is not a key of transformers' 'llama' config \(LlamaConfig\); "
                                             r"did you mean 'rope_theta'\?"):
        build_model(f"{TINY_LLAMA},rope_thetta=500000.0", input_shape=(8,))
    # rope_type lives in rope_parameters too, but given as a key llama keeps it as a loose attribute
    with pytest.raises(ModelSpecError, match=r"'rope_typ' is not a key") as refused:
        build_model(f"{TINY_LLAMA},rope_typ=linear", input_shape=(8,))
    assert "'rope_type'" not in str(refused.value)


def test_a_label_count_beyond_the_bound_is_refused_before_any_config_is_made(monkeypatch):
    # a config builds a label table entry by entry as it is made: num_labels=10**8 filled 20 GB first
    import planner.models.hf_config as hf_config

    made = []
    tf = hf_config.transformers_module()
    monkeypatch.setattr(tf.AutoConfig, "for_model", lambda *a, **k: made.append(k) or pytest.fail("config made"))
    with pytest.raises(ModelSpecError, match=r"num_labels=100,000,000 is more than 100,000 classes"):
        build_model("hf:vit:num_hidden_layers=1,hidden_size=16,num_attention_heads=2,intermediate_size=32,"
                    "num_labels=100000000", input_shape=(3, 32, 32))
    assert made == []
