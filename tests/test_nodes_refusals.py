"""What `pplan partition` says when the refusal is not about memory: a global batch no layout
splits into the micro-batches the --nodes search runs names that limit with its numbers and
fixes that were searched (each then run here); a batch past the bound is refused alike with and
without --nodes; --recompute auto is offered only where it is not what failed and a plan fits with it."""

import json
import re

import pytest

from planner.errors import InfeasibleError, ScheduleError
from planner.hardware import load_hardware
from planner.partition.parallel_checks import MAX_MICROBATCHES
from planner.partition.parallel_search import plan_parallel
from planner.profiling.analytic import analytic_profile
from helpers.cli import one_error_line
from helpers.plans import write_synthetic_profile

GPT = "gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200"
SMALL = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=32000"
ROOMY = 2**50  # a PiB per GPU: memory is never why


@pytest.fixture(scope="module")
def small():
    return analytic_profile(SMALL, load_hardware("a100-80gb"), "bfloat16", [1, 2, 4, 8])


def _fix_flags(line: str) -> list[list[str]]:
    """The command-line flags of each fix after '; use ' (a fix's plan in parentheses dropped)."""
    fixes = re.split(r", or |, (?=--|\d+ GPUs)", line.split("; use ", 1)[1])
    out = []
    for fix in fixes:
        if m := re.match(r"\d+ GPUs \((\d+) nodes of \d+\)", fix):
            out.append(["--nodes", m.group(1)])
        else:
            flag, value = fix.split(" (")[0].split()
            out.append([flag, value])
    return out


def test_the_audited_batch_is_refused_for_its_split_with_fixes_that_run(pplan, analytic_profile, tmp_path):
    csv = analytic_profile(GPT, "1,2,4,8")
    base = {"--nodes": "2", "--hardware": "a100-40gb", "--memory": "100TB", "--global-batch": "1048576"}
    line = one_error_line(*pplan("partition", csv, *[w for kv in base.items() for w in kv])[::2])
    # 16 GPUs x 4096 micro-batches x 8 samples = 524288 < 1048576, whatever the memory
    assert "does not split on 16 GPUs" in line and "16 replicas x 4096 x 8 = 524288 samples at most" in line, line
    assert "no plan fits" not in line and "TiB" not in line, line
    flags = _fix_flags(line)
    assert ["--microbatches", "4096"] in flags and ["--nodes", "4"] in flags and ["--global-batch", "524288"] in flags, line
    for flag, value in flags:
        out = tmp_path / f"plan{flag}.json"
        args = {**base, flag: value}
        code, _, err = pplan("partition", csv, *[w for kv in args.items() for w in kv], "--out", out)
        assert code == 0, (flag, value, err)
        assert json.loads(out.read_text())["global_batch"] == int(args["--global-batch"])


def test_a_batch_no_replica_count_divides_finely_enough_is_refused_for_that(small):
    prime = 262139  # under 8 x 4096 x 8 = 262144, but only dp=1 and b=1 divide it: 262139 micro-batches
    with pytest.raises(ScheduleError) as e:
        plan_parallel(small, hardware="a100-80gb", nodes=1, global_batch=prime, memory_bytes=ROOMY)
    assert f"no replica count (a divisor of 8) x micro-batch size divides {prime} into so few" in e.value.message
    (fix,) = re.findall(r"--global-batch (\d+)", e.value.hint)
    assert plan_parallel(small, hardware="a100-80gb", nodes=1, global_batch=int(fix), memory_bytes=ROOMY).best.fits


def test_a_forced_layout_names_its_replicas_and_without_hint_checks_is_a_schedule_error(small):
    batch = 2 * MAX_MICROBATCHES * 8 * 2  # twice what dp=2 splits
    kwargs = dict(hardware="a100-80gb", nodes=1, global_batch=batch, memory_bytes=ROOMY, parallel="dp=2,pp=4,tp=1")
    with pytest.raises(ScheduleError) as e:  # the layout sweep of --plot takes a ScheduleError as "does not run"
        plan_parallel(small, check_hints=False, **kwargs)
    assert "on --parallel dp=2,pp=4,tp=1" in e.value.message and "2 replicas x 4096 x 8 = 65536" in e.value.message
    with pytest.raises(ScheduleError) as e:
        plan_parallel(small, **kwargs)
    assert "GPUs (" not in e.value.hint  # more nodes is another layout: not offered for a forced one
    held = int(re.search(r"--microbatches (\d+)", e.value.hint).group(1))
    assert plan_parallel(small, **{**kwargs, "microbatches": held}).best.fits


def test_memory_still_names_itself_when_the_batch_splits(small):
    with pytest.raises(InfeasibleError) as e:
        plan_parallel(small, hardware="a100-80gb", nodes=1, global_batch=64, memory_bytes=2**26, recompute="none")
    assert "no plan fits 64.0 MiB per GPU" in e.value.message


@pytest.mark.parametrize("batch", ["1000000000000", "99999999999999999999999"])
def test_an_absurd_batch_is_refused_alike_with_and_without_nodes(pplan, analytic_profile, batch):
    csv = analytic_profile(SMALL, "1,2")
    pipeline = one_error_line(*pplan("partition", csv, "--devices", 2, "--global-batch", batch)[::2])
    cluster = one_error_line(*pplan("partition", csv, "--nodes", 2, "--hardware", "a100-40gb", "--global-batch", batch)[::2])
    assert cluster == pipeline and "absurdly large (more than 1e+08 samples per iteration)" in cluster, (cluster, pipeline)


def _cluster(tmp_path, memories: tuple[str, str]):
    path = tmp_path / f"cluster-{'-'.join(memories)}.json"
    path.write_text(json.dumps({"format": "pplan-cluster/1", "default_link": {"bandwidth": "10GB/s"},
                                "devices": [{"name": f"d{i}", "memory": m} for i, m in enumerate(memories)]}))
    return path


# 8 layers of 100 kB activations a sample: 400+300 KiB fit with recompute (auto or all) only; 150+100 KiB fit nothing
@pytest.mark.parametrize("memories, recompute, offered", [
    (("400KiB", "300KiB"), "none", True),  # auto fits there (checked below)
    (("150KiB", "100KiB"), "none", False),  # auto fits no better
    (("150KiB", "100KiB"), "auto", False),  # auto is what failed
    (("150KiB", "100KiB"), "all", False),
])
def test_recompute_auto_is_offered_only_where_it_fits(pplan, tmp_path, memories, recompute, offered):
    csv = tmp_path / "syn.csv"
    write_synthetic_profile(csv, 8, 1, act_bytes=100_000)
    cluster = _cluster(tmp_path, memories)
    line = one_error_line(*pplan("partition", csv, "--cluster", cluster, "--global-batch", 8, "--recompute", recompute)[::2])
    assert "no plan fits the cluster's device memory" in line and "add memory or devices" in line, line
    assert ("--recompute auto" in line) is offered, line
    if offered:
        assert pplan("partition", csv, "--cluster", cluster, "--global-batch", 8, "--recompute", "auto",
                     "--out", tmp_path / "plan.json")[0] == 0


def test_identical_devices_offer_recompute_auto_only_where_it_fits(pplan, tmp_path):
    csv = tmp_path / "syn.csv"
    write_synthetic_profile(csv, 8, 1, act_bytes=100_000)
    for memory, offered in (("400KiB", True), ("100KiB", False)):
        line = one_error_line(*pplan("partition", csv, "--devices", 2, "--memory", memory, "--global-batch", 8,
                                     "--recompute", "none")[::2])
        assert ("--recompute auto" in line) is offered, line
