"""--input-shape, --input-dtype and --vocab are refused for a model kind that would ignore them.

Only a plain module:factory Sequential reads all three; an hf: model reads --input-shape (its
sequence length or image shape). A flag a model ignores used to run silently with exit code 0:
the user believed they had profiled or trained another input than the one measured.
"""

from __future__ import annotations

import pytest

from planner.errors import ModelSpecError
from planner.execute import RunOptions
from planner.execute.preflight import preflight
from planner.models.spec import check_input_flags
from planner.plan import load_plan

from helpers.plans import write_plan

MLP = "mlp:layers=2,hidden=4,input=3"
FLAGS = {"--input-shape": {"input_shape": (3, 32, 32)}, "--input-dtype": {"input_dtype": "long"}, "--vocab": {"vocab": 5}}


@pytest.mark.parametrize("spec", ["gpt:layers=1", "resnet", MLP, "synthetic:layers=2"])
@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_each_flag_is_refused_for_every_builtin_kind(spec, flag):
    kind = spec.partition(":")[0]
    with pytest.raises(ModelSpecError, match=rf"^{flag} given for built-in {kind} model '{spec}': a built-in takes its input "
                                             rf"sizes from its spec .*; drop {flag}; set the sizes in the spec, e.g. {kind}:\w+=\d"):
        check_input_flags(spec, **FLAGS[flag])
    assert check_input_flags(spec) == kind  # no flag: nothing to refuse


def test_a_factory_reads_every_flag_and_hf_only_the_input_shape():
    every = {k: v for flags in FLAGS.values() for k, v in flags.items()}
    assert check_input_flags("factory_models:plain", **every) == "factory"
    assert check_input_flags("hf:gpt2:n_layer=1", input_shape=(16,)) == "hf"
    with pytest.raises(ModelSpecError, match=r"^--input-dtype, --vocab given for hf: model 'hf:gpt2:n_layer=1', which takes "
                                             r"its vocabulary \(vocab_size\) from its config.*set vocab_size=N in the spec"):
        check_input_flags("hf:gpt2:n_layer=1", input_dtype="long", vocab=5)


@pytest.mark.parametrize("flag,value", [("--input-shape", "3,32,32"), ("--input-dtype", "float"), ("--vocab", "5")])
def test_profile_refuses_a_flag_a_builtin_ignores_in_one_line(tmp_path, pplan, flag, value):
    # --input-dtype float is refused too: given at all, it says the user thinks the model reads it
    out = tmp_path / "p.csv"
    code, stdout, stderr = pplan("profile", "-m", MLP, "-b", "1", "--warmup", "0", "--repeats", "1", flag, value, "-o", out)
    assert code == 2, stderr
    assert stderr.startswith(f"pplan: error: {flag} given for built-in mlp model '{MLP}'") and stderr.count("\n") == 1
    assert "Traceback" not in stderr and not out.exists()


def test_run_preflight_refuses_the_flags_a_builtin_plan_ignores(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.json", MLP, "1f1b", 2, [(0, 1), (1, 2)]))
    for flag, value in FLAGS.items():
        with pytest.raises(ModelSpecError, match=rf"^{flag} given for built-in mlp model"):
            preflight(plan, RunOptions(device="cpu", **value))
    assert preflight(plan, RunOptions(device="cpu")).n_layers == 2


def test_run_cli_refuses_them_before_any_rank_starts(tmp_path, pplan):
    path = write_plan(tmp_path / "p.json", MLP, "1f1b", 2, [(0, 1), (1, 2)])
    out = tmp_path / "run.json"
    code, stdout, stderr = pplan("run", path, "--steps", "1", "--device", "cpu", "--vocab", "5", "-o", out)
    assert code == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("pplan: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"pplan: error: --vocab given for built-in mlp model '{MLP}'")
    assert "step 1/" not in stderr and "Traceback" not in stderr and not out.exists()
