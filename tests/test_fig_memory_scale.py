"""Figure 2 draws what a reader can tell apart, not one artist per device: beyond MAX_BARS devices
the peaks are stacked areas, memory over time shows the MAX_LINES devices nearest their limit,
and the caption says how many were left out. At the 4,000 devices a pipeline may have, the old
figure (20,000 bars, 4,000 notes, a 4,000-entry legend) took about two minutes to draw."""

from __future__ import annotations

from planner.plan.records import MAX_PIPELINE_STAGES
from planner.report.fig_memory import MAX_BARS, MAX_LINES, caption, draw, nearest_limit
from planner.report.inputs import ReportInputs, parse_sim
from planner.report.style import MEMORY_PARTS, style_context

MIB = 1 << 20
LIMIT = 100 * MIB


def _inputs(peaks_mib: list[int], limits_mib: list[int | None] | None = None, timeline: bool = True) -> ReportInputs:
    """A simulation of len(peaks_mib) devices: device s peaks at peaks_mib[s] MiB (a fifth each of
    weights, gradients, optimizer, activations, buffers), its memory rising to the peak and back."""
    limits_mib = limits_mib if limits_mib is not None else [LIMIT // MIB] * len(peaks_mib)
    devices, memory = [], {}
    for s, (peak, limit) in enumerate(zip(peaks_mib, limits_mib)):
        part = peak * MIB // 5
        devices.append({"device": s, "name": f"dev{s}", "busy_ms": 10.0, "idle_ms": 1.0, "peak_memory_bytes": 5 * part,
                        "memory": {**{p: part for p in MEMORY_PARTS}, "total": 5 * part},
                        "memory_limit_bytes": limit * MIB if limit else None})
        memory[str(s)] = [[0.0, 3 * part], [1.0 + s % 3, 5 * part], [9.0, 3 * part]]
    sim = {"iteration_ms": 11.0, "bubble_fraction": 0.1, "throughput_samples_per_s": 100.0, "schedule": "1f1b",
           "n_microbatches": 4, "micro_batch_size": 1, "interpolated": False, "devices": devices,
           "memory_timeline": memory if timeline else {}}
    return ReportInputs(sim=parse_sim(sim))


def _counts(ax) -> tuple[int, int, int, int]:
    return len(ax.patches), len(ax.collections), len(ax.lines), len(ax.texts)


def test_bars_up_to_max_bars_then_a_fixed_number_of_artists_whatever_the_devices():
    with style_context():
        bars = draw(_inputs([50] * MAX_BARS)).axes[0]
        assert len(bars.patches) == len(MEMORY_PARTS) * MAX_BARS  # a bar per device and kind, as before
        counts = set()
        for n in (MAX_BARS + 1, 4 * MAX_BARS, MAX_PIPELINE_STAGES):
            fig = draw(_inputs([50 + s % 7 for s in range(n)]))
            counts.add(tuple(_counts(ax) for ax in fig.axes) + (len(fig.axes[1].get_legend().texts),))
            assert max(fig.get_size_inches()) < 40.0  # not stretched to the widest a report draws
    assert len(counts) == 1, counts  # 65 devices or 4,000: the same artists
    ((patches, collections, lines, texts), timeline, legend) = counts.pop()
    assert patches == 0 and collections == len(MEMORY_PARTS) + 1 and texts == 1  # areas, the limit, one note
    assert len(timeline) and legend == MAX_LINES + 1  # the lines drawn and the memory limit


def test_memory_over_time_shows_the_devices_nearest_their_limit():
    near = [1, 4, 6, 9, 12, 15, 16, 19]
    assert len(near) == MAX_LINES
    peaks = [95 if s in near else 40 for s in range(20)]
    peaks[7] = 300  # the largest peak, but no limit: it cannot run out
    limits = [None if s == 7 else LIMIT // MIB for s in range(20)]
    with style_context():
        fig = draw(_inputs(peaks, limits))
    timeline = fig.axes[1]
    drawn = [line for line in timeline.lines if line.get_label().startswith("dev")]
    assert [line.get_label() for line in drawn] == [f"dev {s}" for s in near]
    colours = [line.get_color() for line in drawn]
    assert len(set(colours)) == MAX_LINES  # a selection never repeats a colour


def test_the_caption_says_how_many_devices_were_left_out():
    assert "the other 12 are left out" in caption(_inputs([50] * 20))
    assert "left out" not in caption(_inputs([50] * MAX_LINES))
    text = caption(_inputs([50] * 100))
    assert "each of the 100 devices (too many for bars" in text and "the other 92 are left out" in text
    assert "left out" not in caption(_inputs([50] * 100, timeline=False))


def test_the_note_names_the_device_nearest_its_limit_and_limits_are_drawn_per_run():
    n = MAX_BARS + 6
    peaks = [50] * n
    peaks[n - 2] = 190  # 95% of its 200 MiB limit; the others are at 50% or 25%, or have none
    limits = [LIMIT // MIB] * 30 + [None] * 10 + [2 * LIMIT // MIB] * (n - 40)
    with style_context():
        ax = draw(_inputs(peaks, limits)).axes[0]
    (note,) = ax.texts
    assert note.get_text() == f"dev {n - 2}: 190 MiB, 95% of limit" and note.get_ha() == "right"  # kept inside
    (limit_lines,) = [c for c in ax.collections if c.get_label() == "memory limit"]
    ends = sorted((seg[0][0], seg[1][0], seg[0][1]) for seg in limit_lines.get_segments())
    assert ends == [(-0.5, 29.5, 100.0), (39.5, n - 0.5, 200.0)]  # one dashed line per run, none without a limit


def test_nearest_limit_ranks_by_share_of_the_limit_then_unlimited_by_peak():
    sim = _inputs([80, 40, 90, 300, 10], [200, 50, 100, None, None]).sim
    devices = sorted(sim.prediction.devices, key=lambda d: d.device)
    assert nearest_limit(devices, [0, 1, 2, 3, 4], 2) == [1, 2]  # 80% and 90% of their limits
    assert nearest_limit(devices, [0, 1, 2, 3, 4], 4) == [0, 1, 2, 3]  # then the larger unlimited peak
    assert nearest_limit(devices, [0, 3, 4], 2) == [0, 3]


def test_a_selection_is_drawn_against_its_own_limits_only():
    n = 4 * MAX_BARS  # each device its own limit, as on a heterogeneous cluster
    with style_context():
        timeline = draw(_inputs([50] * n, [100 + s for s in range(n)])).axes[1]
    limit_lines = [line for line in timeline.lines if not line.get_label().startswith("dev")]
    assert len(limit_lines) == MAX_LINES  # the 8 devices drawn, each nearest to its own limit
    assert sorted(line.get_ydata()[0] for line in limit_lines) == [100.0 + s for s in range(MAX_LINES)]
