"""A private torch or transformers name a release dropped ends in one line, not an AttributeError.

Each test removes the name with monkeypatch, as a future release would, and checks the error names
it with the installed and the tested version; with the name present nothing changes.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch.distributed.pipelining.schedules as schedules

from planner.errors import PplanError
from planner.torch_compat import TESTED_VERSIONS, private_attr, private_import


def _one_line(error: pytest.ExceptionInfo, name: str, package: str) -> str:
    text = str(error.value)
    assert "\n" not in text and name in text
    assert f"{package} {importlib.metadata.version(package)}" in text  # the installed version
    assert f"{package}=={TESTED_VERSIONS[package]}.*" in text  # what to install
    return text


def test_present_names_are_returned_unchanged():
    assert private_import("torch.distributed.pipelining.schedules", "_PipelineScheduleRuntime", "torch") is schedules._PipelineScheduleRuntime
    assert private_attr(schedules._PipelineScheduleRuntime, "_load_csv", "torch") is schedules._PipelineScheduleRuntime._load_csv


def test_a_dropped_torch_class_is_one_line(monkeypatch):
    monkeypatch.delattr(schedules, "_PipelineScheduleRuntime")
    with pytest.raises(PplanError) as e:
        private_import("torch.distributed.pipelining.schedules", "_PipelineScheduleRuntime", "torch")
    _one_line(e, "torch.distributed.pipelining.schedules._PipelineScheduleRuntime", "torch")


def test_a_dropped_method_is_named_with_its_class(monkeypatch):
    monkeypatch.delattr(schedules._PipelineSchedule, "_maybe_compute_loss")
    with pytest.raises(PplanError) as e:
        private_attr(schedules.ScheduleGPipe.__new__(schedules.ScheduleGPipe), "_maybe_compute_loss", "torch")
    _one_line(e, "torch.distributed.pipelining.schedules.ScheduleGPipe._maybe_compute_loss", "torch")


def test_measure_wraps_the_loss_through_the_check(monkeypatch):
    from planner.execute.measure import ActionRecorder

    monkeypatch.delattr(schedules._PipelineSchedule, "_maybe_compute_loss")
    schedule = schedules.ScheduleGPipe.__new__(schedules.ScheduleGPipe)
    with pytest.raises(PplanError) as e:
        ActionRecorder.wrap_loss(None, schedule)
    _one_line(e, "_maybe_compute_loss", "torch")


def test_an_hf_model_without_the_auto_mapping_is_one_line(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from planner.models import build_model

    build_model("hf:gpt2:n_layer=1,n_embd=16,n_head=2,vocab_size=64,n_positions=64", 0)  # present: builds as before
    for auto in (transformers.AutoModelForMaskedLM, transformers.AutoModelForCausalLM, transformers.AutoModelForImageClassification):
        monkeypatch.delattr(auto, "_model_mapping")  # what is left is their base's None
    with pytest.raises(PplanError) as e:
        build_model("hf:gpt2:n_layer=1,n_embd=16,n_head=2,vocab_size=64,n_positions=64", 0)
    _one_line(e, "AutoModelForMaskedLM._model_mapping", "transformers")
