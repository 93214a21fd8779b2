"""Bring your own model, run: every kind of model users bring, planned by `partition` on its
measured profile for every schedule the search allows, trains as a pipeline exactly as one
process would (multi-process, slow).

MATRIX holds each (model, schedule) the search allows at least once, on 2 or 3 devices
(alternating, so every model runs on both), half of them with every layer recomputed;
test_matrix_is_what_the_search_allows holds it to the search's own `skipped` record. Its cuts
come from the partitioner on a profile measured at one micro-batch size (b = 2: global batch 8
in M = 4 micro-batches, one repeat), so they may move between runs: any cut must train the
same. PINNED adds hand-written plans for what a partitioner's plan need not contain. Each plan
trains 3 Adam steps at lr 1e-2 on one thread per rank, against planner.execute.reference's
one-process run (gradient accumulation over the same micro-batches) on one thread.

Plans run through the executor's rank loop (planner.execute.train.train_rank, what `pplan run`'s
ranks run), several per launch (helpers.plans.run_plans_in_one_launch): starting a rank and
importing torch and transformers costs seconds, three tiny steps a fraction of one.
test_profile_partition_run_needs_no_flag_twice goes through the CLI's `pplan run` whole.

Tolerances:
- no shared weight (all but GPT-2 tied, BERT and `shared`): losses within 1e-12 relative (both
  average the same four float32 micro-batch losses in float64, perhaps in another order),
  weights and buffers (BatchNorm's running statistics) bit for bit. Nothing reorders a float32
  sum: the same kernels on the same micro-batch shapes in the same order, the same thread count
  in ranks and reference (helpers/equivalence.py: CPU kernels split reductions by thread),
  M = 4 a power of two so torch's 1/M scaling of the summed gradient equals the reference's
  per-micro-batch 1/M, recompute replays the same forward kernels. A difference is a bug.
- a weight two layers hold (GPT-2's and BERT's embedding = output projection; a module called
  twice): its gradient is summed over the stages that hold it after torch scaled each stage's
  part by 1/M, where one process accumulates both parts per micro-batch: float32 sums in
  another order. Losses within 1e-6 relative, weights within TIED_ATOL = 1e-4 absolute. Adam's
  step lr * m / (sqrt(v) + eps) does not shrink with the gradient, so an ulp in a near-zero
  gradient element can move its weight by a good part of lr = 1e-2; measured here over 3
  steps: weights up to 1.3e-5 apart (GPT-2), 4.4e-6 (BERT), 3e-8 (`shared`), losses up to
  2.5e-8 relative.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planner.execute.checkpoint import latest_checkpoint, load_rank_file
from planner.execute.reference import reference_run
from planner.partition.api import partition
from planner.partition.search import PartitionSettings
from planner.plan import Plan, load_plan
from planner.schedules import SCHEDULE_NAMES

from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.models import BYOM_MODELS
from helpers.plans import assert_trains_alike, run_plans_in_one_launch, write_plan

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
TIED_ATOL = 1e-4
GLOBAL_BATCH, MICROBATCHES = 8, 4

# (model, schedule, devices, recompute mode given to partition): every (model, schedule) the
# search allows; devices alternate 2/3 (interleaved needs 2 stages per device, so the 4-layer
# Hugging Face models run it on 2); the docs' 3-layer Sequential has no interleaved plan.
MATRIX = [
    ("gpt2-tied", "gpipe", 2, "none"), ("gpt2-tied", "1f1b", 3, "all"),
    ("gpt2-tied", "interleaved", 2, "all"), ("gpt2-tied", "zb", 3, "none"),
    ("gpt2-untied", "gpipe", 3, "all"), ("gpt2-untied", "1f1b", 2, "none"),
    ("gpt2-untied", "interleaved", 2, "none"), ("gpt2-untied", "zb", 2, "all"),
    ("llama", "gpipe", 2, "all"), ("llama", "1f1b", 3, "none"), ("llama", "interleaved", 2, "none"), ("llama", "zb", 3, "all"),
    ("bert", "gpipe", 3, "none"), ("bert", "1f1b", 2, "all"), ("bert", "interleaved", 2, "all"), ("bert", "zb", 2, "none"),
    ("hf-vit", "gpipe", 2, "none"), ("hf-vit", "1f1b", 3, "all"), ("hf-vit", "interleaved", 2, "all"), ("hf-vit", "zb", 3, "none"),
    ("hf-resnet", "gpipe", 3, "all"), ("hf-resnet", "1f1b", 2, "none"),
    ("hf-resnet", "interleaved", 2, "none"), ("hf-resnet", "zb", 2, "all"),
    ("docs-mlp", "gpipe", 2, "all"), ("docs-mlp", "1f1b", 3, "none"), ("docs-mlp", "zb", 3, "all"),
    ("cnn", "gpipe", 3, "none"), ("cnn", "1f1b", 2, "all"), ("cnn", "interleaved", 3, "none"), ("cnn", "zb", 2, "all"),
    ("residual", "gpipe", 2, "all"), ("residual", "1f1b", 3, "none"),
    ("residual", "interleaved", 3, "all"), ("residual", "zb", 2, "none"),
]

# Hand-written plans, each pinning what a partitioner's plan need not contain:
# name -> (model, schedule, stages (layers), recompute {stage: [layers]})
PINNED = {
    # recompute of single layers on both sides of a skip edge, in an interleaved plan
    "residual-interleaved-2": ("residual", "interleaved", [(0, 2), (2, 3), (3, 5), (5, 7)], {1: [2], 2: [3]}),
    # a non-contiguous view (a transposed sequence) at every cut
    "vit-seq-1f1b-2": ("vit-seq", "1f1b", [(0, 2), (2, 5)], {}),
    # the tied embedding's two holders on two ranks, recompute on the head that reads it
    "gpt2-tied-1f1b-2": ("gpt2-tied", "1f1b", [(0, 2), (2, 4)], {1: [3]}),
    # a module called twice (layers 1 and 3 share its weights, tests/test_byom_shared.py) on stages
    # 0 and 2 of one rank: torch scales each stage's gradients by 1/M, the shared ones only once
    "shared-interleaved-same-rank": ("shared", "interleaved", [(0, 2), (2, 3), (3, 4), (4, 5)], {2: [3]}),
    # ... on two ranks, the gradient summed across them after split (I/W) backwards
    "shared-zb-two-ranks": ("shared", "zb", [(0, 2), (2, 5)], {}),
    # ... both uses on one stage (not the first) under split backwards: torch's W step needs the
    # graph between the two uses after its first parameter group (weight_backward.retain_graph_in_weight_backward)
    "shared-zb-one-stage": ("shared", "zb", [(0, 1), (1, 5)], {}),
    # ... on ranks 0 and 2 of three, recompute on the first
    "shared-1f1b-three-ranks": ("shared", "1f1b", [(0, 2), (2, 3), (3, 5)], {0: [1]}),
    # a stage of parameter-free layers (ReLU, MaxPool, Flatten): nothing for its optimizer to
    # hold (torch's refuse an empty list) and nothing for its W steps to compute
    "cnn-zb-3-parameter-free-stage": ("cnn", "zb", [(0, 5), (5, 8), (8, 11)], {}),
}

CASES: dict[str, tuple[str, int]] = {**{f"{m}-{s}-{d}-{r}": (m, d) for m, s, d, r in MATRIX},
                                     **{k: (v[0], 2 if v[1] == "interleaved" else len(v[2])) for k, v in PINNED.items()}}
"""case id -> (model, devices), for grouping cases into launches."""


def _profile(name: str) -> Any:
    from planner.profiling.profiler import profile_model

    spec, shape, _ = BYOM_MODELS[name]
    # one size, no warm-up, one repeat: the cuts may be rough, the tests only need a real plan
    return profile_model(spec, [GLOBAL_BATCH // MICROBATCHES], warmup=0, repeats=1, threads=1, input_shape=shape)


@pytest.fixture(scope="module")
def profiles() -> Any:
    """name -> the model's measured profile, measured once per module."""
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if BYOM_MODELS[name][0].startswith("hf:"):
            pytest.importorskip("transformers")
        if name not in cache:
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(ROOT)  # examples.byom_models is imported from the repository root
                cache[name] = _profile(name)
        return cache[name]

    return get


def _settings(devices: int, schedule: str = "auto", recompute: str = "none") -> PartitionSettings:
    return PartitionSettings(n_devices=devices, memory_bytes=None, global_batch=GLOBAL_BATCH, microbatches=MICROBATCHES,
                             schedule=schedule, recompute=recompute)


def _allowed(profile: Any, devices: int) -> set[str]:
    """Schedules the search keeps at these sizes (the others are in its `skipped` record)."""
    skipped = partition(profile, _settings(devices)).plan.search.skipped
    return {s for s in SCHEDULE_NAMES if not any(line.startswith((f"{s}:", f"{s} ")) for line in skipped)}


def test_matrix_is_what_the_search_allows(profiles):
    """Every schedule the search allows for a model is in the matrix at a device count that
    allows it, every model runs on 2 and on 3 devices, and what it leaves out it says why."""
    for name in sorted({m for m, *_ in MATRIX}):
        prof = profiles(name)
        allowed = {d: _allowed(prof, d) for d in (2, 3)}
        cases = [(s, d) for m, s, d, _ in MATRIX if m == name]
        assert {s for s, _ in cases} == allowed[2] | allowed[3], name
        assert all(s in allowed[d] for s, d in cases), name
        assert {d for _, d in cases} == {2, 3}, name
    skipped = partition(profiles("docs-mlp"), _settings(2)).plan.search.skipped
    assert "interleaved: needs 4 stages but the model has 3 layers" in skipped


def _make_plan(profiles: Any, case: str, folder: Path) -> Plan:
    """The partitioner's plan of a MATRIX case, or a PINNED case's hand-written one."""
    if case in PINNED:
        model, schedule, stages, recompute = PINNED[case]
        return load_plan(write_plan(folder / f"{case}.json", BYOM_MODELS[model][0], schedule, CASES[case][1], stages,
                                    n_microbatches=MICROBATCHES, recompute=recompute))
    model, schedule, devices, recompute = next(c for c in MATRIX if f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" == case)
    plan = partition(profiles(model), _settings(devices, schedule, recompute)).plan
    assert (plan.schedule, plan.n_devices, plan.n_microbatches, plan.model) == (schedule, devices, MICROBATCHES, BYOM_MODELS[model][0])
    if recompute == "all":
        assert all(list(st.recompute) == list(range(*st.layers)) for st in plan.stages)
    return plan


def _launch_key(case: str) -> tuple[bool, int]:
    model, devices = CASES[case]
    return BYOM_MODELS[model][0].startswith("hf:"), devices


@pytest.fixture(scope="module")
def launched(profiles, tmp_path_factory) -> Any:
    """case -> (plan, losses, checkpoint folder). Cases run in one launch per (Hugging Face or
    not, devices), each launch when one of its cases is first asked for."""
    groups: dict[tuple[bool, int], Any] = {}

    def get(case: str) -> tuple[Plan, list[float], Path]:
        key = _launch_key(case)
        if key not in groups:
            cases = [c for c in CASES if _launch_key(c) == key]
            folder = tmp_path_factory.mktemp(f"{'hf' if key[0] else 'user'}-{key[1]}")
            try:
                with pytest.MonkeyPatch.context() as mp:
                    mp.chdir(ROOT)
                    plans = [_make_plan(profiles, c, folder) for c in cases]
                    shapes = [BYOM_MODELS[CASES[c][0]][1] for c in cases]
                    losses = run_plans_in_one_launch(plans, shapes, folder, STEPS)
                groups[key] = {c: (p, ls, folder / f"ck{i}") for i, (c, p, ls) in enumerate(zip(cases, plans, losses))}
            except Exception as e:  # noqa: BLE001 - every case of the launch reports the failure
                groups[key] = e
        if isinstance(groups[key], BaseException):
            raise groups[key]
        return groups[key][case]

    return get


def _trains_as_one_process(launched: Any, case: str) -> None:
    spec, shape, tied = BYOM_MODELS[CASES[case][0]]
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    plan, losses, ck = launched(case)
    _, folder = latest_checkpoint(ck, plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    with torch_threads(EQUIVALENCE_THREADS):
        ref_losses, ref = reference_run(plan, STEPS, lr=1e-2, model_kwargs={"input_shape": shape} if shape else {})
    assert_trains_alike(losses, got, ref_losses, ref, loss_rel=1e-6 if tied else 1e-12, atol=TIED_ATOL if tied else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("case", [f"{m}-{s}-{d}-{r}" for m, s, d, r in MATRIX])
def test_partitioned_run_equals_one_process(monkeypatch, launched, case):
    monkeypatch.chdir(ROOT)
    _trains_as_one_process(launched, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PINNED))
def test_hand_written_run_equals_one_process(monkeypatch, launched, case):
    monkeypatch.chdir(ROOT)
    _trains_as_one_process(launched, case)


@pytest.mark.slow
@pytest.mark.parametrize("model,flags", [
    ("examples.byom_models:mlp", ["--input-shape", "784"]),  # docs/models.md's example
    (BYOM_MODELS["gpt2-tied"][0], ["--input-shape", "16"]),
])
def test_profile_partition_run_needs_no_flag_twice(pplan, monkeypatch, tmp_path, model, flags):
    """The user's path through the CLI with partition's own choice of schedule, cuts and
    recompute: `run` reads the input description from the profile, and trains as one process would."""
    if model.startswith("hf:"):
        pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    prof, plan_json = tmp_path / "p.csv", tmp_path / "plan.json"
    code, _, err = pplan("profile", "--model", model, *flags, "-b", "2,4", "--warmup", "0", "--repeats", "1", "-o", prof)
    assert code == 0, err
    code, _, err = pplan("partition", prof, "--devices", "2", "--global-batch", "8", "--out", plan_json)
    assert code == 0, err
    code, out, err = pplan("run", plan_json, "--steps", "2", "--lr", "1e-2", "--threads", "1",
                            "--model", model, "--checkpoint-dir", tmp_path / "ck")
    assert code == 0, err
    assert "loss:" in out
    plan = load_plan(plan_json)
    _, folder = latest_checkpoint(tmp_path / "ck", plan)
    got: dict = {}
    for r in range(plan.n_devices):
        got.update(load_rank_file(folder, r)["layers"])
    with torch_threads(1):
        ref_losses, ref = reference_run(plan, 2, lr=1e-2, model_kwargs={"input_shape": (784,) if "mlp" in model else (16,)})
    # the losses are printed rounded: the weights carry the comparison
    assert_trains_alike(ref_losses, got, ref_losses, ref, loss_rel=0, atol=TIED_ATOL)
