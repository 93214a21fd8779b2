"""Which data x pipeline x tensor layouts `pplan run` executes for a model: the one rule the 3-D
search plans by (it leaves out, or for a forced layout refuses, every other), and the executor's
preflight and `build_pipeline` refuse by, in the same words.

Two parts, both pure (no torch, nothing built):

- the layout alone (planner.parallel.run_error): ZeRO-2/3 over dp > 1 replicas with tp > 1;
- the model (`tp_model_error`): tensor parallelism splits the built-in gpt's blocks only
  (planner.execute.tensor), so tp > 1 needs a `gpt` model spec whose attention heads and FFN
  width tp divides. The spec alone decides, read by planner.models.spec without building the
  model: a gpt too large for this machine (GPT-3 175B's analytic profile) is judged by its
  heads and FFN width like any other. A profile carries the spec in its `# model:` line,
  measured and analytic alike (`Profile.meta["model"]`); a profile without one, a Hugging Face
  model (`hf:`), a factory (`module:factory`) or another built-in runs with tp = 1 only.

This module sits in planner/partition (layer 5), below planner/execute, so the search and the
executor import the same functions; planner.parallel (layer 0) cannot read a model spec.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.errors import ModelSpecError, PplanError
from planner.models.spec import parse_spec
from planner.parallel import ParallelConfig, run_error

__all__ = ["TP_MODELS", "tp_shape_error", "tp_model_error", "layout_error", "layout_refusal", "runnable_alternatives"]

TP_MODELS = ("gpt",)
"""Model kinds whose layers `pplan run` splits over tp ranks (the built-in gpt's blocks)."""


def tp_shape_error(heads: int, ffn_width: int, tp: int, model: str | None = None) -> PplanError | None:
    """The error when `tp` does not divide `heads` attention heads and the FFN width (each tp rank
    computes whole heads and an equal share of the MLP), else None; planner.execute.tensor asks it
    of every block it splits too."""
    if tp <= 1 or (heads % tp == 0 and ffn_width % tp == 0):
        return None
    common = math.gcd(heads, ffn_width)
    fits = [t for t in range(2, min(common, 64) + 1) if common % t == 0][:6]
    of = f" (model {model!r})" if model else ""
    return PplanError(f"tp {tp} does not divide the gpt's {heads} attention heads and FFN width {ffn_width}{of}",
                      "re-plan with a tp that divides both" + (f" ({', '.join(map(str, fits))})" if fits else "") + ", or tp=1")


def tp_model_error(model: str | None, tp: int) -> PplanError | None:
    """The error when `pplan run` cannot split model spec `model` over `tp` tensor-parallel ranks
    (module docstring), else None (always None for tp = 1)."""
    if tp <= 1:
        return None
    try:
        kind, params = parse_spec(model) if model else ("", {})
    except ModelSpecError:
        kind, params = "", {}
    if kind not in TP_MODELS:
        what = f"model {model!r}" if model else "a profile without a model spec (no '# model:' line)"
        return PplanError(f"tensor parallelism (tp {tp}) runs only on the built-in gpt, not on {what}",
                          "re-plan with tp=1 (--parallel dp=D,pp=P,tp=1)")
    return tp_shape_error(params["heads"], params["ffn"] * params["hidden"], tp, model)


def layout_error(cfg: ParallelConfig, model: str | None) -> PplanError | None:
    """Why `pplan run` cannot execute layout `cfg` of model spec `model`, as an error with its hint,
    or None when it can: the model's rule first (tp_model_error), then the layout's (run_error)."""
    return tp_model_error(model, cfg.tp) or run_error(cfg)


def layout_refusal(cfg: ParallelConfig, model: str | None) -> str | None:
    """layout_error as one line (what the search records for a layout it leaves out), or None."""
    error = layout_error(cfg, model)
    return None if error is None else error.one_line()


def runnable_alternatives(cfg: ParallelConfig, model: str | None, gpus_per_node: int,
                          global_batch: int | None = None) -> list[ParallelConfig]:
    """Layouts of as many GPUs and pipeline stages as `cfg` that `pplan run` executes for `model`,
    nearest first: `cfg` with ZeRO-1 (when only its ZeRO stage is refused), the largest smaller tp
    that runs (its ranks moved into dp), and tp = 1. With `global_batch`, only layouts whose dp
    divides it (the search's own batch split, parallel_checks.check_batch_splits: dp x micro-batch
    size divides the batch): moving tp ranks into dp multiplies dp, so the list may be empty."""
    def splits(alt: ParallelConfig) -> bool:
        return global_batch is None or global_batch % alt.dp == 0

    out = []
    if cfg.zero >= 2 and splits(cfg) and layout_error(replace(cfg, zero=1), model) is None:
        out.append(replace(cfg, zero=1))
    for t in sorted((t for t in range(1, cfg.tp) if cfg.tp % t == 0 and gpus_per_node % t == 0), reverse=True):
        alt = replace(cfg, dp=cfg.dp * cfg.tp // t, tp=t)
        if splits(alt) and layout_error(alt, model) is None:
            out.append(alt)
            break
    tp1 = replace(cfg, dp=cfg.dp * cfg.tp, tp=1)
    return out + ([tp1] if tp1 not in out and splits(tp1) else [])
