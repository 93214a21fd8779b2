"""Throughput per GPU across dp x pp x tp layouts of one cluster: chosen point starred, layouts
that do not fit the GPU's memory hollow (drawn where they would be if they fitted).

With the GPU count fixed, a layout is its (pp, tp): dp = GPUs / (pp x tp). So the x axis is pp,
one line per tp degree, and the figure keeps one width however many layouts there are (a
cluster of 1,536 GPUs has 52; a README page shrinks anything wider to unreadable labels).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any, Sequence

from planner.atomic import atomic_write_bytes
from planner.report.style import new_figure, render, style_context

__all__ = ["FIGURE_WIDTH_IN", "draw_layouts", "write_layout_figure", "chosen_words", "plain_title"]

FIGURE_WIDTH_IN = 9.0
"""Width whatever the layout count: ~1,170 px at the PNG's 130 dpi, so a page's width shrinks it
to about 0.7x and 10-11 pt text stays 9 px or taller even at 0.5x."""
_TP_COLORS = {1: "#4C72B0", 2: "#55A868", 4: "#C44E52", 8: "#8172B2", 16: "#937860", 32: "#DA8BC3"}
_TITLE_CHARS, _SUBTITLE_CHARS = 88, 104
"""Longest line of the title (12 pt bold) and subtitle (10.5 pt) before it wraps: what 9 inches hold."""
_OTHER_COLOR = "#555555"
_STAR_COLOR = "#DD8452"
_HOLLOW_WORDS = "hollow: does not fit the memory per GPU; drawn at its best plan's TFLOP/s with no memory limit"
# Spec keys read better as words; a key not named here is shown as "key value".
_KEY_WORDS = {"layers": "{} layers", "heads": "{} heads", "hidden": "hidden size {}", "seq": "sequence {} tokens",
              "vocab": "vocabulary {}", "ffn": "MLP {}x hidden"}


def _number_words(value: str) -> str:
    return f"{int(value):,}" if value.isdigit() else value


def _spec_words(spec: str) -> str:
    """`gpt:layers=96,hidden=12288` -> `GPT, 96 layers, hidden size 12,288`; anything else as given."""
    kind, sep, rest = spec.partition(":")
    pairs = [part.partition("=") for part in rest.split(",")] if sep else []
    if not re.fullmatch(r"[a-z]+", kind) or not pairs or any(not eq or not key or not value for key, eq, value in pairs):
        return spec  # a factory or hf: spec is its own best name
    words = [_KEY_WORDS.get(key, key + " {}").format(_number_words(value)) for key, _, value in pairs]
    return ", ".join([kind.upper()] + words)


def plain_title(title: str) -> str:
    """The figure's first line from job.layouts_title (`SPEC\\nN x HARDWARE, global batch B, chosen ...`):
    the model in words, then the GPUs and batch; the chosen layout gets its own line (chosen_words)."""
    model, _, rest = title.partition("\n")
    context = rest.split(", chosen ")[0].strip()  # the chosen layout is restated, with more, below
    gpus = re.fullmatch(r"(\d+) x ([^,]+)(?:, global batch (\d+))?", context)
    if gpus:
        batch = f", global batch of {int(gpus.group(3)):,} samples" if gpus.group(3) else ""
        context = f"{int(gpus.group(1)):,} × {gpus.group(2)} GPUs{batch}"
    lines = [_spec_words(model.strip())] + ([f"on {context}"] if context else [])
    return _wrapped(lines, _TITLE_CHARS)


def _wrapped(lines: Sequence[str], width: int) -> str:
    """The lines joined, each wrapped at `width` characters: a factory spec can be longer than the figure is wide."""
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in lines)


def _layout_words(cfg: Any) -> str:
    return f"dp {cfg.dp} × pp {cfg.pp} × tp {cfg.tp}"


def chosen_words(chosen: Any) -> str:
    """`chosen: dp 24 × pp 8 × tp 8, 1f1b, M = 64 micro-batches of b = 1, 151.7 TFLOP/s per GPU`."""
    cfg = chosen.config
    extras = "".join([f", ZeRO {cfg.zero}" if cfg.zero else "",
                      f", recompute {chosen.recompute}" if chosen.recompute != "none" else ""])
    return (f"chosen: {_layout_words(cfg)}, {chosen.schedule_label}, "
            f"M = {chosen.n_microbatches} micro-batches of b = {chosen.micro_batch_size}{extras}, "
            f"{chosen.tflops_per_gpu:.1f} TFLOP/s per GPU")


def _color(tp: int) -> str:
    return _TP_COLORS.get(tp, _OTHER_COLOR)


def _label_offset(marks: Sequence[tuple[float, float]], star: tuple[float, float]) -> tuple[float, float]:
    """Where the chosen layout's name goes, in axes fractions from its star: of a few places
    around it, the one farthest from every other marker (a label over markers hides them)."""
    def clearance(offset: tuple[float, float]) -> float:
        cx, cy = star[0] + offset[0], star[1] + offset[1]
        if not (0.14 <= cx <= 0.86 and 0.06 <= cy <= 0.94):  # the name, ~0.25 wide, stays inside the axes
            return -1.0
        return min([abs(cx - mx) / 2.5 + abs(cy - my) for mx, my in marks] + [1.0])  # the name is wide: x counts less
    return max(((0.0, 0.13), (0.0, -0.13), (0.17, 0.12), (-0.17, 0.12), (0.17, -0.12), (-0.17, -0.12),
                (0.0, 0.22), (0.0, -0.22)), key=clearance)


def draw_layouts(points: Sequence[Any], chosen: Any, title: str) -> Any:
    """Figure: x the pipeline degree pp, y TFLOP/s per GPU, one line of markers per tp degree
    (filled: fits; hollow: does not), the chosen layout starred and named."""
    from matplotlib.lines import Line2D

    drawn = [p for p in points if p.tflops_per_gpu is not None]
    pps = sorted({p.config.pp for p in drawn} | {chosen.config.pp})
    x_of = {pp: i for i, pp in enumerate(pps)}  # evenly spaced: pp degrees are divisors, crowded on a log axis
    cfg = chosen.config
    star = (x_of[cfg.pp], chosen.tflops_per_gpu)
    top = max([p.tflops_per_gpu for p in drawn] + [star[1], 1e-9]) * 1.2  # room above the best marker
    fig = new_figure(FIGURE_WIDTH_IN, 5.8)
    ax = fig.add_subplot(1, 1, 1)
    handles = []
    for tp in sorted({p.config.tp for p in drawn}):
        line = sorted((p for p in drawn if p.config.tp == tp), key=lambda p: p.config.pp)
        color = _color(tp)
        xs, ys = [x_of[p.config.pp] for p in line], [p.tflops_per_gpu for p in line]
        ax.plot(xs, ys, color=color, lw=1.0, alpha=0.45, zorder=2)  # ties one tp degree's markers together
        ax.scatter(xs, ys, s=58, marker="o", zorder=3, linewidths=1.6, edgecolors=color,
                   facecolors=[color if p.fits else "white" for p in line])
        handles.append(Line2D([], [], marker="o", ms=8, ls="-", lw=1.0, color=color, label=f"tp = {tp}"))
    ax.scatter([star[0]], [star[1]], s=380, marker="*", color=_STAR_COLOR, edgecolors="black", linewidths=1.0, zorder=5)

    def to_axes(x: float, y: float) -> tuple[float, float]:  # the x axis runs from -0.5 to len(pps) - 0.5
        return (x + 0.5) / len(pps), y / top

    others = [to_axes(x_of[p.config.pp], p.tflops_per_gpu) for p in drawn if p.config.pp != cfg.pp or p.config.tp != cfg.tp]
    dx, dy = _label_offset(others, to_axes(*star))
    sx, sy = to_axes(*star)
    ax.annotate(_layout_words(cfg), star, xytext=(sx + dx, sy + dy), textcoords="axes fraction",
                ha="center", va="center", fontsize=10.5, fontweight="bold", zorder=2.5,  # leader under the markers
                bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#999999", alpha=0.9),
                arrowprops=dict(arrowstyle="-", color="#555555", lw=1.0, shrinkB=9))
    handles.append(Line2D([], [], marker="*", ms=15, ls="none", color=_STAR_COLOR, mec="black", label="chosen"))
    handles.append(Line2D([], [], marker="o", ms=8, ls="none", mfc="white", mec=_OTHER_COLOR, mew=1.6,
                          label="does not fit memory"))
    ax.set_xticks(range(len(pps)))
    crowded = len(pps) > 16
    ax.set_xticklabels([str(pp) for pp in pps], fontsize=10.5, rotation=45 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlim(-0.5, len(pps) - 0.5)
    ax.tick_params(axis="y", labelsize=10.5)
    ax.set_xlabel("pipeline stages pp   (data-parallel replicas dp = GPUs / (pp \u00d7 tp))", fontsize=11)
    ax.set_ylabel("achieved TFLOP/s per GPU", fontsize=11)
    ax.set_ylim(0, top)
    ax.grid(axis="x", visible=False)
    fig.suptitle(plain_title(title), fontsize=12, x=0.01, ha="left")
    subtitle = _wrapped([f"\u2605 {chosen_words(chosen)}", f"\u25cb {_HOLLOW_WORDS}"], _SUBTITLE_CHARS)
    ax.set_title(subtitle, fontsize=10.5, fontweight="normal", loc="left", color="#333333")
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=10.5)
    return fig


def write_layout_figure(points: Sequence[Any], chosen: Any, title: str, path: Any) -> None:
    """Draw and write the PNG atomically."""
    with style_context():
        fig = draw_layouts(points, chosen, title)
        atomic_write_bytes(path, render(fig, "png", dpi=130))
