"""Synthetic profiles for tests and benchmarks of the planner (no torch, deterministic).

`gpt_like`   embedding + n transformer blocks + LM head: the embedding and head carry most
             parameters, the head a large logits activation (the classic first/last stage OOM).
`imbalanced` random layer times and sizes spread over two orders of magnitude.
`uniform`    identical layers.
Each is measured at several micro-batch sizes; a layer's time at b samples is
per-sample x (b + overhead_samples), so small micro-batches are less efficient per sample, as on
real devices (a micro-batch of 1 costs what overhead_samples + 1 samples would at full speed).
"""

from __future__ import annotations

import numpy as np

from planner.profiling.profile import Profile, make_profile

__all__ = ["gpt_like", "imbalanced", "uniform_layers", "synthetic_profile"]

_SIZES = (1, 2, 4, 8, 16, 32)


def synthetic_profile(names: list[str], fwd1: np.ndarray, params: np.ndarray, act1: np.ndarray, out1: np.ndarray,
                      overhead_samples: float, sizes: tuple[int, ...], meta: dict[str, str]) -> Profile:
    """A profile from per-sample costs: at each size b, time = per-sample x (b + overhead), bytes = per-sample x b."""
    b = np.asarray(sizes, dtype=float)[None, :]
    fwd = fwd1[:, None] * (b + overhead_samples)
    cols = {
        "fwd_ms": np.round(fwd, 6),
        "bwd_ms": np.round(2.0 * fwd, 6),
        "param_bytes": np.repeat(params[:, None], len(sizes), axis=1),
        "activation_bytes": np.round(act1[:, None] * b),
        "output_bytes": np.round(out1[:, None] * b),
    }
    return make_profile(names, list(sizes), cols, meta)


def gpt_like(n_blocks: int = 24, hidden: int = 1024, seq: int = 512, vocab: int = 50_000,
             sizes: tuple[int, ...] = _SIZES, overhead_samples: float = 1.0) -> Profile:
    """Embedding, n_blocks blocks and an LM head with GPT-2-like per-sample costs (fp32)."""
    h, s, v = hidden, seq, vocab
    flop_ms = 2e-11  # ms per flop-ish unit: only ratios matter
    names = ["embed"] + [f"block{i}" for i in range(n_blocks)] + ["head"]
    block_flops = 24 * s * h * h + 4 * s * s * h
    fwd1 = np.array([s * h * 2e-3] + [block_flops] * n_blocks + [2 * s * h * v], dtype=float) * flop_ms
    fwd1[0] = max(fwd1[0], 1e-3)
    params = np.array([v * h * 4 + s * h * 4] + [12 * h * h * 4 + 13 * h * 4] * n_blocks + [v * h * 4 + 2 * h * 4], dtype=float)
    act1 = np.array([s * h * 4] + [(34 * s * h + 5 * s * s * 16) * 2] * n_blocks + [s * v * 4 * 2], dtype=float)
    out1 = np.array([s * h * 4] * (n_blocks + 1) + [s * v * 4], dtype=float)
    meta = {"model": f"gpt:layers={n_blocks},hidden={h},seq={s},vocab={v}", "seed": "0",
            "input_bytes_per_sample": str(s * 8), "source": "planner.partition.synthetic.gpt_like"}
    return synthetic_profile(names, fwd1, params, act1, out1, overhead_samples, sizes, meta)


def imbalanced(n_layers: int = 200, seed: int = 0, sizes: tuple[int, ...] = _SIZES,
               overhead_samples: float = 1.0) -> Profile:
    """Layers whose time, parameters and activations vary log-uniformly over ~100x."""
    rng = np.random.default_rng(seed)
    fwd1 = np.exp(rng.uniform(np.log(0.01), np.log(1.0), n_layers))
    params = np.round(np.exp(rng.uniform(np.log(1e5), np.log(5e7), n_layers)))
    act1 = np.round(np.exp(rng.uniform(np.log(1e5), np.log(2e7), n_layers)))
    out1 = np.round(np.exp(rng.uniform(np.log(1e4), np.log(2e6), n_layers)))
    names = [f"layer{i}" for i in range(n_layers)]
    meta = {"model": f"synthetic:layers={n_layers}", "seed": str(seed), "source": "planner.partition.synthetic.imbalanced"}
    return synthetic_profile(names, fwd1, params, act1, out1, overhead_samples, sizes, meta)


def uniform_layers(n_layers: int = 32, fwd_ms: float = 1.0, param_bytes: float = 4e6, act_bytes: float = 2e6,
                   out_bytes: float = 2e5, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> Profile:
    """Identical layers (per-sample costs), for closed-form checks."""
    n = n_layers
    return synthetic_profile([f"layer{i}" for i in range(n)], np.full(n, fwd_ms), np.full(n, param_bytes), np.full(n, act_bytes),
                  np.full(n, out_bytes), 0.0, sizes, {"model": f"synthetic:layers={n}", "seed": "0"})
