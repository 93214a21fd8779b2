"""A figure review's fixes, read back from the matplotlib figures' artists (no pixel comparisons):

1. the layer-graph figure (`pplan partition --plot`): no cut line runs through a text, the layer
   names turn upright all together or not at all, every box carries its layer index, and every
   stage band names its stage and device;
2. report figure 5: a recomputed layer's bar is what the cost model keeps for it (its checkpoint
   input), every stage label gives its time (above the panel where its band is narrow), and
   neighbouring stage bands are clearly different tints;
3. report figure 2: each memory limit line carries its value, clear of the memory lines;
4. report figure 4: without a memory limit nothing speaks of fitting one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.report.inputs import ReportInputs, parse_sim
from planner.report.style import MEMORY_PARTS, style_context

DATA = Path(__file__).parent / "data" / "report"
MIB = 1 << 20
UNET_NAMES = ["enc1", "down1", "enc2", "down2", "mid", "up2", "dec2", "up1", "dec1", "head"]
UNET_OUTPUTS = [0, 1024, 0, 512, 1024, 4096, 2048, 8192, 4096, 16]
UNET_SKIPS = [(0, 7, 4096, (1,)), (2, 5, 2048, (3,))]


# ---- 1. the layer-graph figure ----------------------------------------------------------------------


def _laid_out(fig):
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


@pytest.mark.parametrize("cuts", [[2, 6], [3, 6], [0, 4, 8]])
def test_no_cut_line_runs_through_a_text(cuts):
    from planner.report.fig_graph import layer_graph_figure

    fig = layer_graph_figure(UNET_NAMES, UNET_OUTPUTS, UNET_SKIPS, cuts)
    renderer = _laid_out(fig)
    ax = fig.axes[0]
    lines = [ax.transData.transform((c + 0.5, 0))[0] for c in cuts]
    for text in ax.texts:
        box = text.get_window_extent(renderer)
        for x in lines:
            assert not box.x0 < x < box.x1, (text.get_text(), box.x0, box.x1, x)
    # cuts [3, 6]: the 2 KiB skip arc's middle (3.5) is on cut 3's line, so its label moved along the arc
    byte_labels = [t for t in ax.texts if t.get_text() in ("2.0 KiB", "4.0 KiB")]
    assert len(byte_labels) >= 2


def _name_rotations(fig, names):
    return {t.get_rotation() for t in fig.axes[0].texts if t.get_text() in names}


def test_layer_names_turn_upright_all_together_or_not_at_all():
    from planner.report.fig_graph import layer_graph_figure

    short = ["embed", "block0", "block1", "head"]
    assert _name_rotations(layer_graph_figure(short, [1] * 4, []), short) == {0.0}
    long = ["embed", "block0", "block1", "a_rather_long_layer_name"]
    assert _name_rotations(layer_graph_figure(long, [1] * 4, []), long) == {90.0}  # "embed" too, not just the long one


def test_every_box_carries_its_layer_index():
    from planner.report.fig_graph import layer_graph_figure

    texts = [t.get_text() for t in layer_graph_figure(UNET_NAMES, UNET_OUTPUTS, UNET_SKIPS, [2, 6]).axes[0].texts]
    assert all(str(i) in texts for i in range(len(UNET_NAMES)))


def test_stage_bands_name_their_stage_and_device(tmp_path, monkeypatch):
    from planner.plan import load_plan
    from planner.profiling.profile import load_profile
    from planner.report import fig_graph

    plan, profile = load_plan(DATA / "plan.json"), load_profile(DATA / "profile.csv")
    assert [fig_graph.stage_label(plan, s) for s in range(plan.n_stages)] == ["stage 0 · dev 0", "stage 1 · dev 1"]
    seen = {}
    real = fig_graph.layer_graph_figure

    def spy(*args, **kwargs):
        seen["fig"] = fig = real(*args, **kwargs)
        return fig

    monkeypatch.setattr(fig_graph, "layer_graph_figure", spy)
    assert fig_graph.plan_graph(plan, profile, tmp_path / "g.png") == [4]
    ax = seen["fig"].axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "stage 0 · dev 0" in texts and "stage 1 · dev 1" in texts
    bands = [p for p in ax.patches if p.get_zorder() == 0]
    assert len(bands) == 2 and bands[0].get_facecolor() != bands[1].get_facecolor()


# ---- 2. report figure 5 -----------------------------------------------------------------------------


def _profile_inputs(tmp_path, stages=None):
    from planner.report import load_inputs

    plan = json.loads((DATA / "plan.json").read_text())
    if stages is not None:
        plan["stages"] = stages
        plan["devices"] = [{"name": f"dev{d}", "memory_bytes": None, "speed": 1.0} for d in range(len(stages))]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return load_inputs(profile=DATA / "profile.csv", plan=path)


def test_a_recomputed_layer_is_drawn_at_its_checkpoint_input(tmp_path):
    from planner.cost import checkpoint_input_bytes
    from planner.report import fig_profile
    from planner.report.style import bytes_axis

    inputs = _profile_inputs(tmp_path)  # stage 0 recomputes layers 1, 2 and 3
    costs = inputs.profile.at(inputs.plan.micro_batch_size)
    with style_context():
        fig = fig_profile.draw(inputs)
    ax_m = fig.axes[1]
    div, _ = bytes_axis(float(max(np.max(costs.param_bytes), np.max(costs.activation_bytes), 1.0)))
    kept = ax_m.containers[1]
    for i in range(inputs.profile.n_layers):
        want = checkpoint_input_bytes(costs)[i] if i in (1, 2, 3) else costs.activation_bytes[i]
        assert kept[i].get_height() * div == pytest.approx(want), i
        assert (kept[i].get_hatch() == "///") == (i in (1, 2, 3))
    assert checkpoint_input_bytes(costs)[1] < costs.activation_bytes[1]  # the fix shows: a shorter bar
    assert any("checkpoint input" in t.get_text() for t in ax_m.get_legend().get_texts())
    assert "checkpoint's input" in fig_profile.caption(inputs)


def test_every_stage_label_gives_its_time_a_narrow_one_above_the_panel(tmp_path):
    from planner.report import fig_profile

    stages = [{"device": 0, "layers": [0, 4], "recompute": []}, {"device": 1, "layers": [4, 7], "recompute": []},
              {"device": 2, "layers": [7, 8], "recompute": []}]
    with style_context():
        fig = fig_profile.draw(_profile_inputs(tmp_path, stages))
    labels = [t for t in fig.axes[0].texts if t.get_text().startswith("stage ")]
    assert [t.get_text().split(" on ")[0] for t in labels] == ["stage 0", "stage 1", "stage 2"]
    assert all(" ms F+B" in t.get_text() for t in labels)
    assert [t.get_position()[1] > 1.0 for t in labels] == [False, False, True]  # the one-layer band's is above
    # the title moved up over it
    renderer = fig.canvas.get_renderer()
    assert fig.axes[0].title.get_window_extent(renderer).y0 >= labels[2].get_window_extent(renderer).y1


def test_crowded_narrow_labels_turn_upright_and_keep_their_time(tmp_path):
    from planner.report import fig_profile

    stages = [{"device": d, "layers": [d, d + 1], "recompute": []} for d in range(8)]
    with style_context():
        fig = fig_profile.draw(_profile_inputs(tmp_path, stages))
    texts = fig.axes[0].texts
    assert len(texts) == 8 and all(t.get_text().endswith(" ms") and t.get_rotation() == 90 for t in texts)


def _blended(patch):
    """A band's colour as seen over white."""
    r, g, b, a = patch.get_facecolor()
    return np.array([1 - a * (1 - r), 1 - a * (1 - g), 1 - a * (1 - b)])


def test_neighbouring_stage_bands_are_clearly_different_tints(tmp_path):
    from planner.report import fig_profile

    stages = [{"device": d, "layers": [2 * d, 2 * d + 2], "recompute": []} for d in range(4)]
    with style_context():
        fig = fig_profile.draw(_profile_inputs(tmp_path, stages))
    bars = {id(p) for c in fig.axes[0].containers for p in c}
    bands = [p for p in fig.axes[0].patches if id(p) not in bars]
    assert len(bands) == 4
    for a, b in zip(bands, bands[1:]):
        assert np.max(np.abs(_blended(a) - _blended(b))) >= 0.08  # device colours at alpha 0.08 differed by 0.03-0.05


# ---- 3. report figure 2 -----------------------------------------------------------------------------


def _sim(limit: int | None, peaks=(19, 14)) -> ReportInputs:
    devices, memory = [], {}
    for s, peak in enumerate(peaks):
        part = peak * MIB // 5
        devices.append({"device": s, "name": f"dev{s}", "busy_ms": 10.0, "idle_ms": 1.0, "peak_memory_bytes": 5 * part,
                        "memory": {**{p: part for p in MEMORY_PARTS}, "total": 5 * part}, "memory_limit_bytes": limit})
        memory[str(s)] = [[0.0, 3 * part], [2.0, 5 * part], [9.0, 3 * part], [10.5, 5 * part]]
    sim = {"iteration_ms": 11.0, "bubble_fraction": 0.1, "throughput_samples_per_s": 100.0, "schedule": "1f1b",
           "n_microbatches": 4, "micro_batch_size": 1, "interpolated": False, "devices": devices,
           "memory_timeline": memory}
    return ReportInputs(sim=parse_sim(sim))


def test_the_limit_line_carries_its_value_clear_of_the_memory_lines():
    from planner.report import fig_memory

    with style_context():
        fig = fig_memory.draw(_sim(20 * MIB))
    ax_bar, ax_t = fig.axes
    (note,) = [t for t in ax_t.texts if t.get_text().startswith("limit ")]
    assert note.get_text() == "limit 20.0 MiB"
    assert "memory limit 20.0 MiB" in [t.get_text() for t in ax_bar.get_legend().get_texts()]
    renderer = fig.canvas.get_renderer()
    assert not _memory_line_under(ax_t, note.get_window_extent(renderer))
    assert not note.get_window_extent(renderer).overlaps(ax_t.get_legend().get_window_extent(renderer))


def _memory_line_under(ax, box) -> bool:
    """Whether a device's memory line (steps, flat then up or down) passes through `box` (pixels)."""
    (x0, y0), (x1, y1) = ax.transData.inverted().transform([[box.x0, box.y0], [box.x1, box.y1]])
    for line in ax.lines:
        if not line.get_label().startswith("dev"):
            continue
        t, y = (np.asarray(v, dtype=float) for v in line.get_data())
        corners = np.column_stack([np.repeat(t, 2)[1:], np.repeat(y, 2)[:-1]])  # the step's corners, in order
        for (ta, ya), (tb, yb) in zip(corners, corners[1:]):
            s = np.linspace(0, 1, 400)
            xs, ys = ta + s * (tb - ta), ya + s * (yb - ya)
            if np.any((xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)):
                return True
    return False


def test_a_device_up_against_its_limit_at_the_right_end_moves_the_value_clear():
    from planner.report import fig_memory

    with style_context():
        fig = fig_memory.draw(_sim(20 * MIB, peaks=(21, 14)))  # dev 0 over its 20 MiB limit at the end
    ax_t = fig.axes[1]
    (note,) = [t for t in ax_t.texts if t.get_text() == "limit 20.0 MiB"]
    assert (note.get_ha(), note.get_va()) != ("right", "bottom")  # not the first place: dev 0's line runs there
    assert not _memory_line_under(ax_t, note.get_window_extent(fig.canvas.get_renderer()))
    right_above = ax_t.annotate("limit 20.0 MiB", (ax_t.get_xlim()[1], 20), xytext=(-4, 3), textcoords="offset points",
                                ha="right", va="bottom", fontsize=8)
    assert _memory_line_under(ax_t, right_above.get_window_extent(fig.canvas.get_renderer()))  # the helper sees it


def test_no_limit_no_value():
    from planner.report import fig_memory

    with style_context():
        fig = fig_memory.draw(_sim(None))
    assert not [t for ax in fig.axes for t in ax.texts if t.get_text().startswith("limit ")]


# ---- 4. report figure 4 -----------------------------------------------------------------------------


def _baseline_inputs(tmp_path, limit: int | None) -> ReportInputs:
    from planner.plan import load_plan

    plan = json.loads((DATA / "plan.json").read_text())
    for d in plan["devices"]:
        d["memory_bytes"] = limit
    if limit is None:  # as `pplan partition` without --memory records them: every split fits
        text = json.dumps(plan).replace('"fits": false', '"fits": true')
        plan = json.loads(text)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return ReportInputs(plan=load_plan(path))


def _says(fig) -> str:
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    texts += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    texts += [ax.get_title() for ax in fig.axes]
    return "\n".join(texts)


def test_without_a_memory_limit_nothing_speaks_of_fitting(tmp_path):
    from planner.report import fig_baselines

    inputs = _baseline_inputs(tmp_path, None)
    with style_context():
        said = _says(fig_baselines.draw(inputs))
    assert "baseline split" in said
    assert "fit" not in said and "limit" not in said
    assert "fit" not in fig_baselines.caption(inputs) and "limit (dashed)" not in fig_baselines.caption(inputs)


def test_with_a_memory_limit_the_figure_still_says_what_fits(tmp_path):
    from planner.report import fig_baselines

    inputs = _baseline_inputs(tmp_path, 37228068)
    with style_context():
        said = _says(fig_baselines.draw(inputs))
    assert "baseline that fits" in said or "does not fit the memory limit" in said
    assert "do not fit the memory limit (dashed)" in fig_baselines.caption(inputs)
