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
"""Tiny configurations of the Hugging Face families tests/test_byom_models.py and test_byom_run.py use
(built from config, no download)."""

_LM = "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,vocab_size=128"
_GQA = f"{_LM},num_key_value_heads=1"
_VIT = "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,image_size=16,patch_size=4,num_labels=10"
_CNN = "depths=1/1,hidden_sizes=8/16,num_labels=10"
HF_FAMILIES = {
    # decoder-only causal LMs; mistral and gemma2 with a sliding window shorter than the 16 tokens
    # the tests use (masks that differ per layer), opt with project_in/out (word_embed_proj_dim)
    "gpt2": HF_SPECS["gpt2"],
    "gpt_neox": f"hf:gpt_neox:{_LM}",
    "gptj": "hf:gptj:n_layer=2,n_embd=32,n_head=2,vocab_size=128,rotary_dim=8",
    "opt": "hf:opt:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,ffn_dim=64,vocab_size=128,word_embed_proj_dim=16",
    "llama": HF_SPECS["llama"],
    "mistral": f"hf:mistral:{_GQA},sliding_window=8",
    "qwen2": HF_SPECS["qwen2"],
    "qwen3": f"hf:qwen3:{_GQA},head_dim=16",
    "phi": f"hf:phi:{_LM}",
    "phi3": f"hf:phi3:{_LM}",
    "gemma": f"hf:gemma:{_GQA},head_dim=16",
    "gemma2": f"hf:gemma2:{_GQA},head_dim=16,sliding_window=8",
    "falcon": "hf:falcon:num_hidden_layers=2,hidden_size=32,num_attention_heads=2,vocab_size=128",
    "bloom": "hf:bloom:n_layer=2,hidden_size=32,n_head=2,vocab_size=128",
    "stablelm": f"hf:stablelm:{_GQA}",  # its default num_key_value_heads (32) exceeds 2 heads
    "olmo": f"hf:olmo:{_LM}",
    "glm": f"hf:glm:{_GQA},head_dim=16",  # a list of end-of-text token ids (pplan drops those beyond the vocabulary)
    # encoder-only masked LMs; albert shares one layer group between its layers
    "bert": HF_SPECS["bert"],
    "roberta": f"hf:roberta:{_LM}",
    "distilbert": "hf:distilbert:n_layers=2,dim=32,n_heads=2,hidden_dim=64,vocab_size=128",
    "albert": f"hf:albert:{_LM},embedding_size=16",
    "electra": f"hf:electra:{_LM},embedding_size=16",
    "deberta-v2": f"hf:deberta-v2:{_LM}",  # absolute positions (its default); relative_attention=true is refused
    # image classifiers
    "vit": HF_SPECS["vit"],
    "deit": f"hf:deit:{_VIT}",
    "resnet": HF_SPECS["resnet"],
    "regnet": f"hf:regnet:{_CNN},embedding_size=8,groups_width=8",
    "convnext": HF_SPECS["convnext"],
    "convnextv2": f"hf:convnextv2:{_CNN},num_stages=2",
    "mobilenet_v2": "hf:mobilenet_v2:image_size=16,depth_multiplier=0.25,num_labels=10",
    # its classifier takes pixel_values positionally and reads the base model's pooled output as outputs[1]
    "hiera": "hf:hiera:embed_dim=8,image_size=16/16,patch_size=3/3,patch_stride=2/2,patch_padding=1/1,depths=1/1,num_heads=1/2,"
             "query_stride=2/2,masked_unit_size=4/4,num_query_pool=1,num_labels=10",
}
"""Every family `hf:` is known to cut correctly, tiny (tests/test_byom_families.py)."""

HF_REFUSED = {
    # relative-position embeddings computed from weights once, then passed to every block
    "deberta-v2-relative": (f"hf:deberta-v2:{_LM},relative_attention=true", "computed from weights"),
    # the base model transposes before its pooler (code between its final modules)
    "swin": ("hf:swin:image_size=16,patch_size=2,embed_dim=8,depths=1/1,num_heads=1/2,window_size=4,num_labels=10", "cut into layers"),
    # patch embeddings between the groups of blocks
    "poolformer": ("hf:poolformer:depths=1/1,hidden_sizes=8/16,num_encoder_blocks=2,patch_sizes=7/3,strides=4/2,padding=2/1,"
                   "pool_size=3,num_labels=10", "between its blocks"),
    "t5": ("hf:t5:num_layers=1", "not a causal LM, masked LM or image classifier"),
    "bart": ("hf:bart:encoder_layers=1,decoder_layers=1,d_model=32,encoder_attention_heads=2,decoder_attention_heads=2,"
             "vocab_size=128", "encoder-decoder"),
}
"""Families `hf:` refuses, with a piece of the one-line reason (docs/models.md lists why)."""

HF_IMAGE = ("vit", "deit", "resnet", "regnet", "convnext", "convnextv2", "mobilenet_v2", "hiera")
"""The image classifiers of HF_FAMILIES (the others take tokens)."""


def hf_input_shape(name: str) -> tuple[int, ...] | None:
    """build_model's input_shape for a family of HF_FAMILIES: 16 tokens, or a 16x16 image (the
    ViTs' config size, None)."""
    if name in ("vit", "deit"):
        return None
    return (3, 16, 16) if name in HF_IMAGE else (16,)


USER_PLANS = {
    # a dict output and a tuple target (packed); `b`'s output read by `cls` and passed on to `reg`
    "two-heads-1f1b": ("factory_models:two_heads", None, "1f1b", [(0, 3), (3, 4)], {0: [1, 2]}),
    "two-heads-dict-zb": ("factory_models:two_heads:target=dict", None, "zb", [(0, 2), (2, 4)], {1: [2]}),
    "two-heads-plain-interleaved": ("factory_models:two_heads_plain", (6,), "interleaved", [(0, 1), (1, 2), (2, 3), (3, 4)], {}),
    # `b, c, h, w = x.shape` read across the cut after layer 0, recomputed there
    "shapes-gpipe": ("factory_models:shapes_across_a_cut", (3, 8, 8), "gpipe", [(0, 1), (1, 3)], {1: [1]}),
    # a causal mask made from shapes and passed to every block, recomputed by each
    "nanogpt-zb": ("factory_models:nanogpt", None, "zb", [(0, 3), (3, 6)], {1: [3, 4]}),
    # nn.TransformerEncoder cut between its blocks
    "encoder-interleaved": ("factory_models:encoder:own_data=true", None, "interleaved", [(0, 2), (2, 3), (3, 4), (4, 5)], {1: [2]}),
}
"""name -> (model spec, input shape, schedule, stages (layers), recompute {stage: [layers]}): 2-device plans of
the user models the issue 13 hunt found failing (tests/factory_models.py), trained in test_byom_families.py's launch."""

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
