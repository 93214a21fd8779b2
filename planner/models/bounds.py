"""How big a model is, known before any weight is allocated, and the bound pplan holds it to.

`build_model` sizes every model before it draws a weight: the built-in families from their
parameters (`builtin_size`, exact parameter counts by formula, `tests/test_model_bounds.py`
checks them against built models), `hf:` models by building them on torch's meta device (shapes
only, no storage; planner.models.hf). A model whose parameters, buffers, fixed data tensors and
one sample's activations exceed `size_bound_bytes()` is refused in one line naming the numbers,
where it used to be allocated until the kernel killed the process (exit 137, no message) or
torch failed with a traceback.

The bound is the memory this process may use (the machine's physical memory, or the cgroup's
limit when that is lower): a model that does not fit in it cannot even be built here. It is not
half of it, although training on the CPU also holds a gradient per weight and an optimizer's
state, because with `--device cuda` those live on the GPU and the host holds about one copy of
the weights (a GPU node's model may take most of its host memory). It is a floor on what is
needed, never a promise that a smaller model fits. The activation estimate is a floor as well:
the output of every layer for one sample, no attention scores, no autograd buffers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from planner.errors import ModelTooLargeError
from planner.units import format_bytes

__all__ = ["ModelSize", "MEMORY_SHARE", "builtin_size", "check_model_size", "size_bound_bytes", "usable_memory_bytes"]

MEMORY_SHARE = 1.0
"""Share of the usable memory one model may take (module docstring: all of it, since with CUDA the
gradients and optimizer state are on the GPU)."""
MODULE_BYTES = 4096
"""Host memory of one nn.Module with its parameter tensors' objects, storage aside (a floor: 20,000
gpt blocks of 7 modules each took 686 MB, 4.9 KB a module, torch 2.13): a spec of millions of
tiny layers would exhaust memory with a few parameters."""
_FLOAT = 4  # built-in models are float32
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclass(frozen=True)
class ModelSize:
    """What a model holds in memory once built, counted without building it."""

    parameters: int
    """Parameters (a tied weight once)."""
    parameter_bytes: int
    """Bytes of those parameters in their dtype."""
    other_bytes: int
    """Buffers and the fixed data tensors the builder draws (class patterns, a teacher)."""
    sample_activation_bytes: int
    """A floor on one sample's activations: every layer's output, nothing more."""
    modules: int
    """nn.Module objects: each takes host memory besides its tensors (MODULE_BYTES)."""

    @property
    def total_bytes(self) -> int:
        """Everything above together: what building and one forward of one sample need at least."""
        return self.parameter_bytes + self.other_bytes + self.sample_activation_bytes + self.modules * MODULE_BYTES


def usable_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when lower; None where neither can be read."""
    found: list[int] = []
    try:
        found.append(max(0, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        pass
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            found.append(int(text))  # "max" (no limit) is not a number and adds nothing
    found = [n for n in found if n > 0]
    return min(found) if found else None


def size_bound_bytes() -> int | None:
    """The most bytes one model may take here (MEMORY_SHARE of usable_memory_bytes); None: unknown."""
    memory = usable_memory_bytes()
    return int(memory * MEMORY_SHARE) if memory else None


def check_model_size(spec: str, size: ModelSize, hint: str) -> None:
    """Refuse `spec` when `size` exceeds size_bound_bytes(), in one line with the numbers and `hint`."""
    bound = size_bound_bytes()
    if bound is None or size.total_bytes <= bound:
        return
    memory = usable_memory_bytes() or 0
    parts = [f"{size.parameters:,} parameters: {format_bytes(size.parameter_bytes)}"] if size.parameters else []
    parts += [f"buffers and data: {format_bytes(size.other_bytes)}"] if size.other_bytes else []
    parts += [f"{size.modules:,} modules: {format_bytes(size.modules * MODULE_BYTES)}"] if size.modules else []
    parts += [f"one sample's activations: {format_bytes(size.sample_activation_bytes)}"] if size.sample_activation_bytes else []
    raise ModelTooLargeError(
        f"model {spec!r} needs at least {format_bytes(size.total_bytes)} ({', '.join(parts)}), above pplan's bound of "
        f"{format_bytes(bound)} (this machine's usable memory, {format_bytes(memory)}): building it would exhaust "
        f"memory",
        hint)


def builtin_size(kind: str, p: dict[str, Any]) -> ModelSize:
    """The size of built-in model `kind` with parsed parameters `p` (planner.models.spec)."""
    return {"gpt": _gpt, "resnet": _resnet, "mlp": _mlp, "synthetic": _synthetic}[kind](p)


def _floats(parameters: int, other: int, activations: int, modules: int) -> ModelSize:
    return ModelSize(parameters, _FLOAT * parameters, _FLOAT * other, _FLOAT * activations, modules)


def _gpt(p: dict[str, Any]) -> ModelSize:
    h, layers, seq, vocab, ffn = p["hidden"], p["layers"], p["seq"], p["vocab"], p["ffn"]
    block = (4 + 2 * ffn) * h * h + (9 + ffn) * h  # qkv, proj, fc1, fc2 with biases; two LayerNorms
    params = (vocab + seq) * h + layers * block + 2 * h + h * vocab  # embeddings, blocks, norm and LM head
    # the Sequential, Embed (2 embeddings), 7 per Block, NormHead (norm, head)
    return _floats(params, 0, (layers + 1) * seq * h + seq * vocab, 7 + 7 * layers)


def _resnet(p: dict[str, Any]) -> ModelSize:
    width, image, channels, classes = p["width"], p["image"], p["channels"], p["classes"]
    params = 9 * channels * width + 2 * width  # stem conv and norm
    acts = channels * image * image + width * image * image
    modules = 1 + 4 + 4  # the Sequential, the stem (conv, norm, ReLU), the head (pool, flatten, linear)
    c = width
    for s, n_blocks in enumerate(p["blocks"]):
        c_out, side = width * 2**s, image // 2**s
        for b in range(n_blocks):
            params += 9 * c * c_out + 9 * c_out * c_out + 4 * c_out  # two convs, two norms
            modules += 6  # the block, two convs, two norms, an identity shortcut
            if (s > 0 and b == 0) or c != c_out:
                params += c * c_out + 2 * c_out  # the 1x1 shortcut conv and its norm
                modules += 2
            acts += c_out * side * side
            c = c_out
    params += c * classes + classes
    return _floats(params, classes * channels * image * image, acts + classes, modules)  # other: one pattern per class


def _mlp(p: dict[str, Any]) -> ModelSize:
    widths = [p["input"]] + [p["hidden"]] * (p["layers"] - 1) + [p["classes"]]
    params = sum(a * b + b for a, b in zip(widths, widths[1:]))
    # other: the teacher that labels the data; modules: the Sequential, (Sequential, Linear, ReLU) per hidden layer, the head
    return _floats(params, p["input"] * p["classes"], sum(widths), 3 * p["layers"] - 1)


def _synthetic(p: dict[str, Any]) -> ModelSize:
    # act_bytes is left out: those buffers are never written, so on the CPU they take no memory
    params = sum(b // _FLOAT for b in p["param_bytes"])
    return _floats(params, 0, (p["layers"] + 1) * p["hidden"], 1 + p["layers"])
