"""Model specs several tests build, and a digest of a model's weights."""

from __future__ import annotations

import hashlib
from typing import Any

TINY_LM = "n_layer=2,n_embd=32,n_head=2,vocab_size=128"
HF_SPECS = {
    "gpt2": f"hf:gpt2:{TINY_LM}",
    "gpt2-untied": f"hf:gpt2:{TINY_LM},tie_word_embeddings=false",
    "llama": "hf:llama:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,num_key_value_heads=1,intermediate_size=64,vocab_size=128",
    "qwen2": "hf:qwen2:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,num_key_value_heads=1,intermediate_size=64,vocab_size=128",
    "bert": "hf:bert:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,vocab_size=128",
    "vit": "hf:vit:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,image_size=16,patch_size=4,num_labels=10",
    "resnet": "hf:resnet:depths=1/1,hidden_sizes=8/16,embedding_size=8,num_labels=10",
    "convnext": "hf:convnext:depths=1/1,hidden_sizes=8/16,num_stages=2,num_labels=10",
}
"""Tiny configurations of every Hugging Face family `hf:` supports (built from config, no download)."""

_IMG = (3, 16, 16)
BYOM_MODELS = {
    "gpt2-tied": (HF_SPECS["gpt2"], (16,), True),
    "gpt2-untied": (HF_SPECS["gpt2-untied"], (16,), False),
    "llama": (HF_SPECS["llama"], (16,), False),
    "bert": (HF_SPECS["bert"], (16,), True),
    "hf-vit": (HF_SPECS["vit"], None, False),
    "hf-resnet": (HF_SPECS["resnet"], _IMG, False),
    "docs-mlp": ("examples.byom_models:mlp:width=64", (784,), False),
    "cnn": ("examples.byom_models:cnn", _IMG, False),
    "residual": ("examples.byom_models:residual", _IMG, False),
    "vit-seq": ("examples.byom_models:vit", _IMG, False),
    "shared": ("examples.byom_models:shared", (16,), True),
}
"""name -> (model spec, input shape for build_model and `run`, has a weight held by two layers):
the models tests/test_byom_*.py take from profile to run. docs-mlp is docs/models.md's Sequential
example; cnn, residual, vit-seq and shared are examples/byom_models.py's."""


def weights_digest(bundle: Any) -> str:
    """sha256 over a ModelBundle's state dict: names and bytes, in order."""
    h = hashlib.sha256()
    for name, t in bundle.layers.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
