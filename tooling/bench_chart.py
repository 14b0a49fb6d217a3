"""The bench's picture: commits/s and the latency distribution of deltacoord and delta-rs, per writer count.

One row per writer count: a bar pair of commits/s (failed commits written on the bars) and both
systems' latency curves (the share of commits done within x ms, log scale), so a reader sees the
throughput ratio and the tails at a glance. Drawn with matplotlib, without a display; SVG keeps the
labels as text (searchable, diffable), a `.png` path gives a bitmap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: deltacoord's colour, then delta-rs's (distinguishable in grey scale too).
COLOURS = ("#1f5fa8", "#d9822b")


@dataclass(frozen=True)
class SystemRun:
    """One system's timed phase: its throughput, its failures and every commit's latency."""

    name: str
    commits_per_s: float
    failed: int
    latencies_ms: Sequence[float]


@dataclass(frozen=True)
class ChartRun:
    writers: int
    systems: tuple[SystemRun, SystemRun]


def _cdf(xs: Sequence[float]) -> tuple[list[float], list[float]]:
    s = sorted(xs)
    n = len(s)
    return s, [(i + 1) / n for i in range(n)]


def write_chart(runs: Sequence[ChartRun], path: Path | str, *, title: str = "deltacoord vs delta-rs") -> Path:
    """Draw `runs` into `path` (SVG; the suffix picks the format, e.g. .png) and return the path."""
    if not runs:
        raise ValueError("no bench runs to draw")
    import matplotlib

    matplotlib.use("svg")  # no display needed; savefig still renders a .png path as a bitmap
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # keep labels as text
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3.6 * len(runs)), squeeze=False)
    for row, run in zip(axes, runs, strict=True):
        bars, curves = row
        names = [s.name for s in run.systems]
        rates = [s.commits_per_s for s in run.systems]
        drawn = bars.bar(names, rates, color=COLOURS)
        for rect, s in zip(drawn, run.systems, strict=True):
            bars.annotate(f"{s.commits_per_s:,.1f}/s\n{s.failed} failed", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                          ha="center", va="bottom", fontsize=9)
        ratio = rates[0] / rates[1] if rates[1] else float("inf")
        bars.set_title(f"{run.writers} writer{'s' if run.writers != 1 else ''}: commits/s ({ratio:,.1f}x)")
        bars.set_ylabel("commits/s")
        bars.set_ylim(0, max(rates) * 1.3 or 1)
        for colour, s in zip(COLOURS, run.systems, strict=True):
            if s.latencies_ms:
                x, y = _cdf(s.latencies_ms)
                curves.step(x, y, where="post", color=colour, label=s.name)
        curves.set_xscale("log")
        curves.set_xlabel("write call to visible in _delta_log (ms, log scale)")
        curves.set_ylabel("share of commits")
        curves.set_title(f"{run.writers} writer{'s' if run.writers != 1 else ''}: latency distribution")
        curves.grid(True, which="both", alpha=0.3)
        curves.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


__all__ = ["ChartRun", "SystemRun", "write_chart"]
