"""Measurement: hand-computed activation/output bytes, sleep timings, profile_model, the CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from planner.models.gpt import Block
from planner.profiling.measure import measure_layer
from planner.profiling.profile import load_profile
from planner.profiling.profiler import profile_model

from helpers.cli import REPO, cli_env, run_pplan

TINY_GPT = "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=50"


def test_linear_relu_bytes_by_hand():
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    b = 3
    m, out, _ = measure_layer(layer, torch.randn(b, 4, requires_grad=True), warmup=0, repeats=1)
    # Linear saves its input (b x 4 floats; the weight is a parameter, not counted);
    # ReLU saves its result (b x 8 floats), which is also the output.
    assert m.activation_bytes == b * 4 * 4 + b * 8 * 4 == 144
    assert m.output_bytes == b * 8 * 4 == 96
    assert m.flops == 2 * b * 4 * 8
    assert out.shape == (b, 8) and not out.requires_grad


def test_attention_block_bytes_by_hand():
    B, T, C, H = 2, 8, 16, 2
    N, F = B * T, 4 * C
    torch.manual_seed(0)
    block = Block(C, H, 4)
    x = torch.randn(B, T, C, requires_grad=True)
    q, k, v = (torch.randn(B, H, T, C // H, requires_grad=True) for _ in range(3))
    kernel = type(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).grad_fn).__name__
    if "FlashAttentionForCpu" not in kernel:
        pytest.skip(f"hand count assumes torch's CPU flash attention kernel, this torch uses {kernel}")
    m, _, _ = measure_layer(block, x, warmup=0, repeats=1)
    f4 = 4  # bytes per float32
    expected = (
        N * C * f4 + 2 * N * f4      # ln1: input, mean, rstd
        + N * C * f4                 # qkv: its input (ln1 output)
        + 3 * N * C * f4             # attention: q, k, v (views of one qkv output storage)
        + N * C * f4 + N * H * f4    # attention: output (proj saves a view of it) and logsumexp
        + N * C * f4 + 2 * N * f4    # ln2: input, mean, rstd
        + N * C * f4                 # fc1: its input
        + N * F * f4                 # gelu: its input
        + N * F * f4                 # fc2: its input
    )
    assert m.activation_bytes == expected == 64 * N * C + 16 * N + 4 * N * H
    assert m.output_bytes == N * C * f4
    # Linear layers 2*N*(3C^2 + C^2 + 2*C*F) plus attention's two (T x T x C) products per sample.
    assert m.flops == 2 * N * (3 * C * C + C * C + 2 * C * F) + 4 * B * T * T * C


def test_shared_input_bytes_and_loss_in_last_layer():
    p = profile_model("mlp:layers=3,hidden=8,input=5,classes=3", [1, 2], warmup=0, repeats=1)
    sizes = [1, 2]
    # fc0 saves x (5 floats) and its ReLU output (8); fc1 saves its input (= fc0's ReLU output,
    # shared) and its own ReLU output; head saves its input (shared), log-softmax (3 floats) and
    # the loss's scalar total weight (the int64 target it saves is the step's batch: planner.cost.batch).
    assert p.columns["activation_bytes"].tolist() == [[b * (5 + 8) * 4 for b in sizes], [b * 16 * 4 for b in sizes], [b * (8 + 3) * 4 + 4 for b in sizes]]
    assert p.columns["shared_input_bytes"].tolist() == [[0, 0], [32, 64], [32, 64]]
    assert p.columns["output_bytes"].tolist() == [[32, 64], [32, 64], [12, 24]]
    assert p.columns["param_bytes"][:, 0].tolist() == [(5 * 8 + 8) * 4, (8 * 8 + 8) * 4, (8 * 3 + 3) * 4]


class _VirtualClock:
    """Stands in for the `time` module: perf_counter reads virtual seconds that only sleep advances.

    Real computation between two readings takes no virtual time, so a sleeping layer measures
    exactly its configured time whatever the machine's load.
    """

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


def test_synthetic_sleeps_profile_at_their_times(monkeypatch):
    # Which sleep lands in which column (fwd, bwd, its input and weight parts), on a virtual
    # clock: exact, no wall-clock tolerance. Real sleeps are timed by `pplan bench fidelity`.
    from planner.models import synthetic
    from planner.profiling import measure

    clock = _VirtualClock()
    monkeypatch.setattr(synthetic, "time", clock)
    monkeypatch.setattr(measure, "time", clock)
    spec = "synthetic:layers=3,fwd_ms=20,bwd_ms=30,weight_frac=0.5,param_bytes=4000/0/4000,act_bytes=1000,hidden=8"
    c = profile_model(spec, [2], warmup=1, repeats=3, timer="wall").columns
    exact = dict(rel=0, abs=1e-6)  # float rounding of virtual seconds -> ms
    assert c["fwd_ms"][:, 0].tolist() == pytest.approx([20, 20, 20], **exact)
    assert c["bwd_ms"][:, 0].tolist() == pytest.approx([30, 30, 30], **exact)
    # layer 0's input is data (no gradient): its whole backward is the weight part;
    # layer 1 has no parameters: all input part; layer 2 splits by weight_frac.
    assert c["bwd_input_ms"][:, 0].tolist() == pytest.approx([0, 30, 15], **exact)
    assert c["bwd_weight_ms"][:, 0].tolist() == pytest.approx([30, 0, 15], **exact)
    assert clock.now > 1000.0  # the layers really slept on this clock


def test_synthetic_bytes_are_what_the_spec_says():
    spec = "synthetic:layers=3,fwd_ms=0,bwd_ms=0,param_bytes=4000/0/4000,act_bytes=1000,hidden=8"
    c = profile_model(spec, [1, 4], warmup=0, repeats=1).columns
    assert c["activation_bytes"][:2].tolist() == [[1000, 4000], [1000, 4000]]
    assert c["activation_bytes"][2].tolist() == [1000 + 32, 4000 + 128]  # + the MSE loss's output (its target is the batch's)
    assert c["param_bytes"][:, 0].tolist() == [4000, 0, 4000]
    assert c["output_bytes"][0].tolist() == [32, 128]
    assert c["shared_input_bytes"].max() == 0


def test_run_queue_wait_is_subtracted_where_it_was_timed(monkeypatch):
    """Each run reads clock, wait counter, clock, (the call), clock, wait counter, clock. A wait
    inside the timed call is subtracted; one between a counter read and a clock read lengthens only
    the outer window and is not (it once made a 0.5 ms layer read 0 ms)."""
    from planner.profiling import measure

    class Script:
        """perf_counter and the wait counter replay fixed readings, seconds and ms."""

        def __init__(self, clocks: list[float], waits: list[float]):
            self.clocks, self.waits = iter(clocks), iter(waits)

        def perf_counter(self) -> float:
            return next(self.clocks)

        def ms(self) -> float:
            return next(self.waits)

        def close(self) -> None:
            pass

    def run(clocks: list[float], waits: list[float], timer: str = "sched") -> list[float]:
        script = Script(clocks, waits)
        monkeypatch.setattr(measure, "RunQueueWait", lambda: script)
        monkeypatch.setattr(measure, "time", script)
        return measure.timed_ms(lambda: None, warmup=0, repeats=len(clocks) // 4, sync=lambda: None, timer=timer)

    us = 1e-6
    # (outer0, t0, t1, outer1) per run; waits (w0, w1) per run, ms
    inside = [0.0, 2 * us, 0.010 + 2 * us, 0.010 + 4 * us]  # 10 ms call, 7 ms of it waiting for a CPU
    assert run(inside, [0.0, 7.0]) == pytest.approx([3.0 + 0.004], abs=1e-9)
    before = [0.0, 0.0005, 0.0015, 0.0015 + 2 * us]  # 0.5 ms wait after the counter read, before t0
    assert run(before, [0.0, 0.5]) == pytest.approx([1.0], abs=1e-9)
    after = [0.0, 2 * us, 0.001 + 2 * us, 0.0015 + 4 * us]  # 0.5 ms wait after t1, before the counter read
    assert run(after, [10.0, 10.5]) == pytest.approx([1.0], abs=1e-9)
    assert run(inside + before, [0.0, 7.0, 7.0, 7.5]) == pytest.approx([3.004, 1.0], abs=1e-9)
    monkeypatch.setattr(measure, "time", Script([0.0, 0.0, 0.010, 0.010], []))  # wall: the timed window as it is
    assert measure.timed_ms(lambda: None, warmup=0, repeats=1, sync=lambda: None, timer="wall") == pytest.approx([10.0])


def test_run_queue_wait_reads_this_thread():
    from planner.profiling.measure import RunQueueWait

    w = RunQueueWait()
    if not w.available:
        pytest.skip("this kernel does not report run-queue waits")
    first = w.ms()
    assert first >= 0 and w.ms() >= first
    w.close()
    assert not w.available and w.ms() == 0.0


def test_synthetic_per_sample_time(monkeypatch):
    from planner.models import synthetic
    from planner.profiling import measure

    clock = _VirtualClock()  # exact sleeps: see test_synthetic_sleeps_profile_at_their_times
    monkeypatch.setattr(synthetic, "time", clock)
    monkeypatch.setattr(measure, "time", clock)
    p = profile_model("synthetic:layers=2,fwd_ms=5,fwd_ms_per_sample=2.5,bwd_ms=1,act_bytes=0,param_bytes=0", [1, 4],
                      warmup=1, repeats=3, timer="wall")
    assert p.columns["fwd_ms"][0].tolist() == pytest.approx([7.5, 15], rel=0, abs=1e-6)  # 5 + 2.5 x batch


def test_profile_model_bytes_are_reproducible_and_metadata_complete():
    a = profile_model(TINY_GPT, [1, 2], warmup=0, repeats=2, seed=3, threads=1, command="pplan profile x")
    b = profile_model(TINY_GPT, [1, 2], warmup=0, repeats=2, seed=3, threads=1)
    assert a.names == ("embed", "block0", "block1", "norm_head") and a.micro_batch_sizes == (1, 2)
    for column in ("param_bytes", "activation_bytes", "output_bytes", "flops", "shared_input_bytes"):
        assert a.columns[column].tolist() == b.columns[column].tolist(), column
    # times: measured, so only their shape is checked (a tiny layer's run-queue-corrected time may
    # round to 0 on a loaded machine)
    for column in ("fwd_ms", "bwd_ms", "optimizer_ms"):
        t = a.columns[column]
        assert np.isfinite(t).all() and (t >= 0).all() and t.sum() > 0, column
    assert a.present >= {"fwd_ms_std", "bwd_input_ms", "bwd_weight_ms", "optimizer_ms", "flops", "shared_input_bytes"}
    assert "cuda_peak_bytes" not in a.present
    for key in ("model", "seed", "device", "device_name", "dtype", "torch", "threads", "date", "command", "input_bytes_per_sample"):
        assert a.meta.get(key), key
    assert a.meta["threads"] == "1" and a.meta["seed"] == "3" and a.meta["command"] == "pplan profile x"
    assert a.input_bytes_per_sample == 8 * 8  # seq int64 tokens
    # embed saves the token ids and the position ids; a block what the hand count above says
    assert a.columns["activation_bytes"][0].tolist() == [64 + 64, 2 * 64 + 64]
    n = lambda b: b * 8  # noqa: E731  tokens per micro-batch
    assert a.columns["activation_bytes"][1].tolist() == [64 * n(b) * 16 + 16 * n(b) + 4 * n(b) * 2 for b in (1, 2)]


def test_bfloat16_halves_float_bytes():
    f32 = profile_model(TINY_GPT, [2], warmup=0, repeats=1)
    bf16 = profile_model(TINY_GPT, [2], warmup=0, repeats=1, dtype="bfloat16")
    assert bf16.meta["dtype"] == "bfloat16"
    assert (bf16.columns["param_bytes"] * 2 == f32.columns["param_bytes"]).all()
    assert bf16.columns["output_bytes"][1, 0] * 2 == f32.columns["output_bytes"][1, 0]


def test_cli_profile_json(tmp_path):
    out = tmp_path / "sub" / "mlp.csv"
    r = run_pplan("profile", "-m", "mlp:layers=2,hidden=8,input=4", "-b", "2,1", "--warmup", "0", "--repeats", "1", "--threads", "1", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["micro_batch_sizes"] == [1, 2] and [row["name"] for row in summary["layers"]] == ["fc0", "head"]
    p = load_profile(out)
    assert p.sha256 == summary["sha256"]
    assert p.meta["command"].startswith("pplan profile -m mlp:layers=2")
    assert summary["layers"][0]["activation_bytes"] == int(p.columns["activation_bytes"][0, 1])
    assert "profiling" in r.stderr  # progress goes to stderr, never into the JSON


def test_cli_profile_table_with_factory(tmp_path, pplan):
    out = tmp_path / "f.csv"
    code, stdout, stderr = pplan("profile", "-m", "factory_models:plain:hidden=6", "--input-shape", "4", "-b", "1,2",
                                 "--warmup", "0", "--repeats", "1", "-o", out)
    assert code == 0, stderr
    for word in ("fc0", "act", "fc1", "activations", "wrote"):
        assert word in stdout
    p = load_profile(out)
    assert p.meta["input_shape"] == "4" and p.meta["input_dtype"] == "float" and p.input_bytes_per_sample == 16


BAD_CLI = {
    "unknown kind": (["-m", "gtp:layers=3"], "unknown model"),
    "unknown key": (["-m", "gpt:layer=3"], "valid keys"),
    "bad value": (["-m", "gpt:layers=x"], "layers='x'"),
    "heads": (["-m", "gpt:hidden=10,heads=3"], "heads=3"),
    "bad sizes": (["-m", "mlp", "-b", "1,x"], "--micro-batch-sizes"),
    "zero size": (["-m", "mlp", "-b", "0,1"], "positive"),
    "bad shape": (["-m", "mlp", "--input-shape", "3,a"], "--input-shape"),
    "bad input dtype": (["-m", "mlp", "--input-dtype", "half"], "--input-dtype"),
    "bad dtype": (["-m", "mlp", "--dtype", "float8"], "float8"),
    "bad device": (["-m", "mlp", "--device", "tpu"], "tpu"),
    "bad timer": (["-m", "mlp", "--timer", "cpu"], "--timer 'cpu' is not supported; use sched or wall"),
    "negative warmup": (["-m", "mlp", "--warmup", "-1"], "--warmup -1 / --repeats 15"),
    "zero threads": (["-m", "mlp", "--threads", "0"], "--threads 0 must be at least 1"),
    "tiny vocab": (["-m", "mlp", "--vocab", "1"], "--vocab 1 must be at least 2"),
    "bad seed": (["-m", "mlp:layers=1,hidden=2,input=2", "-b", "1", "--seed", "-3"], "seed"),
    "no module": (["-m", "no_such_pkg_q.models:make"], "cannot import"),
    "factory without shape": (["-m", "factory_models:plain"], "--input-shape"),
    "fails while profiling": (["-m", "factory_models:fails_at_batch_two", "-b", "1,2", "--warmup", "0", "--repeats", "1"], "layer 1 (picky) failed at micro-batch size 2: RuntimeError: boom at batch two"),
    "out of cpu memory": (["-m", "factory_models:out_of_cpu_memory_at_batch_two", "-b", "1,2", "--warmup", "0", "--repeats", "1"],
                          "out of memory in layer 1 (greedy) at micro-batch size 2; profile smaller micro-batch sizes"),
    "out not csv": (["-m", "mlp", "-o", "OUT.txt"], ".csv"),
    "out is a directory": (["-m", "mlp", "-o", "DIR"], "is a directory"),
}
if not torch.cuda.is_available():
    BAD_CLI["no cuda"] = (["-m", "mlp:layers=1,hidden=2,input=2", "-b", "1", "--device", "cuda"], "CUDA is not available")
# A real process for a few (no traceback may escape the interpreter); the rest run main() in-process.
SUBPROCESS = {"unknown kind", "fails while profiling"}


@pytest.mark.parametrize("case", sorted(BAD_CLI))
def test_cli_errors_exit_2_with_one_line(tmp_path, pplan, case):
    args, words = BAD_CLI[case]
    work = tmp_path / "work"
    work.mkdir()
    args = [a.replace("OUT", str(work / "out")).replace("DIR", str(work)) for a in args]
    if "-o" not in args:
        args += ["-o", str(work / "out.csv")]
    if case in SUBPROCESS:
        r = run_pplan("profile", *args)
        code, stdout, stderr = r.returncode, r.stdout, r.stderr
    else:
        code, stdout, stderr = pplan("profile", *args)
    assert code == 2, (code, stdout, stderr)
    assert "Traceback" not in stdout + stderr
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("pplan: error:") and words in lines[-1], stderr
    assert [line for line in lines if line.startswith("pplan: error:")] == [lines[-1]]
    assert list(work.iterdir()) == [], "a failed profile must not leave a file behind"


@pytest.mark.parametrize("args", [["--timer", "cpu"], ["--warmup", "-1"], ["--threads", "0"], ["--dtype", "float8"]],
                         ids=["timer", "warmup", "threads", "dtype"])
def test_a_bad_profile_setting_fails_before_torch_is_imported(tmp_path, args):
    """The settings are checked by planner.profiling.options, which is torch-free: a typo costs a
    fraction of a second, not torch's import (seconds on a small machine)."""
    code = ("import sys\nfrom cli.app import main\n"
            f"sys.argv = ['pplan', 'profile', '-m', 'mlp', '-o', {str(tmp_path / 'p.csv')!r}, *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=120)
    assert "EXIT 2" in r.stdout and "TORCH False" in r.stdout, (r.stdout, r.stderr)
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_profile_records_allocator_peak():
    p = profile_model(TINY_GPT, [1, 2], device="cuda", warmup=1, repeats=2)
    assert "cuda_peak_bytes" in p.present and p.meta["device"].startswith("cuda")
    assert (p.columns["cuda_peak_bytes"][1:] > 0).all()
    assert (p.columns["activation_bytes"] > 0).all() and (p.columns["fwd_ms"] > 0).all()
    cpu = profile_model(TINY_GPT, [1, 2], warmup=0, repeats=1)
    assert (p.columns["param_bytes"] == cpu.columns["param_bytes"]).all()
    assert (p.columns["output_bytes"] == cpu.columns["output_bytes"]).all()


@pytest.mark.slow
def test_gpt4_profile_bytes_agree_run_to_run():
    """4-layer gpt on CPU, twice: every byte count agrees exactly; times are printed, not judged
    (their run-to-run spread depends on the machine's load: that is `pplan bench`'s business)."""
    # byte counts do not depend on how often a layer is timed: few repeats keep this test short
    runs = [profile_model("gpt:layers=4", [1, 4], threads=1, warmup=1, repeats=3) for _ in range(2)]
    a, b = runs
    for column in ("param_bytes", "activation_bytes", "output_bytes", "flops", "shared_input_bytes"):
        assert (a.columns[column] == b.columns[column]).all(), column
    for column in ("fwd_ms", "bwd_ms"):
        for p in runs:
            times = p.columns[column]
            assert np.isfinite(times).all() and (times >= 0).all() and times.sum() > 0, column
        ok = a.columns[column] > 0
        ratio = b.columns[column][ok] / a.columns[column][ok]
        print(f"\n{column} run2/run1: median {np.median(ratio):.3f} (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def test_profile_table_shows_what_a_layer_sends_past_the_next_one(tmp_path, pplan):
    # enc1 hands nothing to down1 directly but keeps a 4 KiB-per-sample tensor for up1 (a skip):
    # the table says so instead of showing a bare "0 B"
    code, stdout, stderr = pplan("profile", "-m", "tests.unet_model:build", "-b", "2", "--warmup", "0", "--repeats", "1",
                                 "--threads", "1", "-o", tmp_path / "unet.csv")
    assert code == 0, stderr
    enc1 = next(line for line in stdout.splitlines() if line.split()[1:2] == ["enc1"])
    assert enc1.rstrip().endswith("0 B + 8.0 KiB skip")
    down1 = next(line for line in stdout.splitlines() if line.split()[1:2] == ["down1"])
    assert "skip" not in down1


def test_a_size_whose_layers_would_not_fit_is_refused_before_it_is_allocated(tmp_path, pplan, monkeypatch):
    """Scaled from the size measured before it: the input check alone passed batches whose first
    layer's output was larger than the machine (the OOM killer would have answered)."""
    import planner.profiling.room as room

    monkeypatch.setattr(room, "available_ram", lambda: 50 * 2**20)  # a machine with 50 MiB left
    out = tmp_path / "p.csv"
    code, _, err = pplan("profile", "-m", "mlp:layers=2,hidden=256,input=16", "-b", "1,100000", "--warmup", "0",
                         "--repeats", "1", "-o", out)
    assert code == 2 and not out.exists()
    assert ("micro-batch size 100000 of model 'mlp:layers=2,hidden=256,input=16': layer 1 (head) would hold about" in err
            and "(scaled from size 1), more than the 50.0 MiB of RAM available; profile sizes up to about" in err), err
