"""Charts drawn on the server as inline SVG: no script, nothing fetched, readable without CSS.

One chart here: a few series of counts over the same time buckets, as grouped bars on a
shared axis. Bars whose count was extrapolated (a bucket fuller than the console reads) are
drawn lighter and say so in their tooltip.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from .html import Html, esc
from .queries import Bucket

WIDTH, HEIGHT = 960, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 24


@dataclass(frozen=True, slots=True)
class Series:
    name: str  # also its CSS class: bar-<name>
    buckets: Sequence[Bucket]


def bars(series: Sequence[Series], step: float, title: str) -> Html:
    """Grouped bars, one group per bucket."""
    if not series or not series[0].buckets:
        return ""
    count = len(series[0].buckets)
    top = max((b.count for s in series for b in s.buckets), default=0)
    scale = _nice(top)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    group = plot_w / count
    bar = max(1.0, group * 0.8 / len(series))
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
    ]
    for i in range(5):
        value = scale * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(_short(value))}</text>'
        )
    for index in range(count):
        x0 = LEFT + index * group + group * 0.1
        for n, s in enumerate(series):
            bucket = s.buckets[index]
            h = 0.0 if scale == 0 else plot_h * bucket.count / scale
            cls = f"bar-{s.name}" + (" estimated" if bucket.estimated else "")
            approx = "about " if bucket.estimated else ""
            tip = f"{s.name}: {approx}{bucket.count} at {_label(bucket.start, step)}"
            parts.append(
                f'<rect class="{esc(cls)}" x="{x0 + n * bar:.1f}" y="{TOP + plot_h - h:.1f}" '
                f'width="{bar:.1f}" height="{h:.1f}"><title>{esc(tip)}</title></rect>'
            )
        if index % max(1, count // 8) == 0:
            start = series[0].buckets[index].start
            parts.append(f'<text x="{x0:.1f}" y="{HEIGHT - 6}">{esc(_label(start, step))}</text>')
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" '
        f'y2="{TOP + plot_h}"/></svg>'
    )
    legend = "".join(f'<span class="{esc(s.name)}">{esc(s.name)}</span>' for s in series)
    return f'<div class="chart">{"".join(parts)}<div class="legend">{legend}</div></div>'


def _nice(top: int) -> float:
    """The axis maximum: 1, 2 or 5 times a power of ten, at or above ``top``."""
    if top <= 0:
        return 4.0
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= top:
                return float(factor * magnitude)
        magnitude *= 10


def _short(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def _label(start: float, step: float) -> str:
    moment = datetime.datetime.fromtimestamp(start, datetime.UTC)
    return moment.strftime("%H:%M" if step < 86400 else "%m-%d")
