"""The figure of `pplan simulate --sweep`: iteration time and bubble per micro-batch count or schedule.

Values whose plan exceeds a device's memory limit are drawn as the baselines figure draws them
(red, hatched, named in the legend); the star marks the fastest value that fits.
"""

from __future__ import annotations

from typing import Any, Sequence

from planner.report.style import new_figure, style_context

__all__ = ["sweep_figure", "best_fitting"]

_OK_COLOR = "#4C72B0"
_OVER_COLOR = "#E8A3A5"
_OVER_EDGE = "#C44E52"
_BUBBLE_COLOR = "#DD8452"
_STAR = {"marker": "*", "ms": 17, "color": "#F2C12E", "mec": "#333333", "ls": "none", "zorder": 5}


def best_fitting(rows: Sequence[Any]) -> Any | None:
    """The fastest row that runs and fits memory (None when none does)."""
    ok = [r for r in rows if r.iteration_ms is not None and r.fits]
    return min(ok, key=lambda r: r.iteration_ms) if ok else None


def sweep_figure(parameter: str, rows: Sequence[Any], title: str) -> Any:
    """Iteration time (bars or line) and bubble fraction per value (matplotlib Figure)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ok = [r for r in rows if r.iteration_ms is not None]
    best = best_fitting(ok)
    with style_context():
        fig = new_figure(8.5, 4.6)
        ax = fig.subplots()
        x = list(range(len(ok)))
        times = [r.iteration_ms for r in ok]
        if parameter == "microbatches":
            labels = [f"{r.n_microbatches}\nx{r.micro_batch_size}" for r in ok]
            ax.plot(x, times, color=_OK_COLOR, lw=1.6, zorder=2)
            for i, r in enumerate(ok):
                fits = bool(r.fits)
                ax.plot([i], [r.iteration_ms], marker="o", ms=7, ls="none", zorder=3,
                        color=_OK_COLOR if fits else _OVER_EDGE, mfc=_OK_COLOR if fits else "white", mew=1.5)
            ax.set_xlabel(f"micro-batches per iteration x samples each (global batch {_global(ok)})")
        else:
            labels = [str(r.value) for r in ok]
            ax.bar(x, times, width=0.6, color=[_OK_COLOR if r.fits else _OVER_COLOR for r in ok],
                   hatch=[None if r.fits else "///" for r in ok], edgecolor=_OVER_EDGE, lw=0, zorder=2)
            ax.set_xlabel("schedule")
        if best is not None:
            ax.plot([ok.index(best)], [best.iteration_ms], **_STAR)
        ax.set_xticks(x, labels)
        ax.set_ylabel("predicted iteration time (ms)")
        ax.set_ylim(0, max(times + [1.0]) * 1.15)
        ax2 = ax.twinx()
        ax2.plot(x, [100 * r.bubble_fraction for r in ok], marker="s", ls="--", color=_BUBBLE_COLOR, zorder=1)
        ax2.set_ylabel("bubble (% of device time)")
        ax2.set_ylim(0, 100)
        ax2.grid(False)
        handles = [Line2D([], [], color=_OK_COLOR, marker="o" if parameter == "microbatches" else "s",
                          ls="-" if parameter == "microbatches" else "none", label="iteration time (fits memory)"),
                   Line2D([], [], color=_BUBBLE_COLOR, marker="s", ls="--", label="bubble")]
        if any(not r.fits for r in ok):
            handles.append(Line2D([], [], color=_OVER_EDGE, marker="o", mfc="white", ls="none",
                                  label="exceeds the memory limit") if parameter == "microbatches" else
                           Patch(facecolor=_OVER_COLOR, hatch="///", edgecolor=_OVER_EDGE,
                                 label="exceeds the memory limit"))
        if best is not None:
            handles.append(Line2D([], [], **{**_STAR, "ms": 12}, label="fastest that fits"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
        fig.suptitle(title)
    return fig


def _global(rows: Sequence[Any]) -> str:
    sizes = sorted({r.global_batch for r in rows})
    return str(sizes[0]) if len(sizes) == 1 else "varies: " + ", ".join(map(str, sizes))
