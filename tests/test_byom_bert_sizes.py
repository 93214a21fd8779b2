"""Masked LMs at sequences longer than the probe that checks their cut.

`hf:` checks a cut against the model's own forward and loss on a short probe
(planner.models.hf.PROBE_SEQ tokens). The probe was once the first tokens of a full-length
batch: a strided slice for any sequence longer than the probe. The masked LMs' own forward (BERT, RoBERTa,
DistilBERT, ALBERT, ELECTRA, ...) flattens its labels with `labels.view(-1)`, which fails on that
slice, so every one of them was refused ("view size is not compatible with input tensor's size
and stride") at 17 tokens or more, although transformers runs them. The other family tests use
16 tokens, the probe's length, where the slice is the whole batch and contiguous.

Tolerances for the pipelined run as tests/test_byom_families.py states them for a weight two
layers hold (BERT's tied embeddings): losses within 1e-6 relative, weights within 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.models import build_model
from planner.models.hf import PROBE_SEQ  # imports transformers only when a model is built

from helpers.models import HF_FAMILIES

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
LONGER = (PROBE_SEQ + 1,)
"""The shortest sequence whose probe slice was strided."""
MASKED = ("bert", "roberta", "distilbert", "albert", "electra")
STEPS, GLOBAL_BATCH, MICROBATCHES, TIED_ATOL = 3, 8, 4, 1e-4


@pytest.mark.parametrize("name", MASKED)
def test_masked_lm_longer_than_the_probe_builds_and_gives_its_own_logits_and_loss(name):
    bundle = build_model(HF_FAMILIES[name], seed=0, input_shape=LONGER)
    model = bundle.layers.source
    x, y = bundle.make_batch(2, 1)
    assert x.shape == (2, LONGER[0])
    bundle.layers.eval()
    model.eval()
    with torch.no_grad():
        ours = bundle.layers(x)
        theirs = model(input_ids=x, labels=y)
    torch.testing.assert_close(ours, theirs.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bundle.loss_fn(ours, y), theirs.loss, rtol=1e-5, atol=1e-6)


def test_masked_lm_loss_takes_labels_sliced_along_the_sequence():
    bundle = build_model(HF_FAMILIES["bert"], seed=0, input_shape=LONGER)
    x, y = bundle.make_batch(2, 1)
    with torch.no_grad():
        logits = bundle.layers(x)
    strided = y[:, :-1]  # a user's loop that drops the last token: labels no longer contiguous
    assert not strided.is_contiguous()
    torch.testing.assert_close(bundle.loss_fn(logits[:, :-1], strided),
                               bundle.loss_fn(logits[:, :-1].contiguous(), strided.contiguous()), rtol=0, atol=0)


@pytest.mark.slow
def test_bert_longer_than_the_probe_trains_as_a_two_stage_pipeline_as_one_process(monkeypatch, tmp_path):
    from planner.execute.checkpoint import latest_checkpoint, load_rank_file
    from planner.execute.reference import reference_run
    from planner.plan import load_plan

    from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
    from helpers.plans import assert_trains_alike, run_plans_in_one_launch, write_plan

    monkeypatch.chdir(ROOT)
    # embed, block0 | block1, head: the tied embedding is on both ranks
    plan = load_plan(write_plan(tmp_path / "bert.json", HF_FAMILIES["bert"], "1f1b", 2, [(0, 2), (2, 4)],
                                micro_batch_size=GLOBAL_BATCH // MICROBATCHES, n_microbatches=MICROBATCHES))
    losses = run_plans_in_one_launch([plan], [LONGER], tmp_path, STEPS)[0]
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref = reference_run(plan, STEPS, lr=1e-2, model_kwargs={"input_shape": LONGER})
    _, folder = latest_checkpoint(tmp_path / "ck0", plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    assert_trains_alike(losses, got, ref_losses, ref, loss_rel=1e-6, atol=TIED_ATOL)
