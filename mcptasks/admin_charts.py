"""Charts for the admin's overview, drawn on the server: the geometry of
stacked bars and of lines over time buckets, which the templates turn into
inline SVG (``admin/mcptasks/overview/*.html``). No script and no chart
library: the page is complete as served, and each mark carries a ``<title>``
that the browser shows on hover."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

#: The drawing's size in SVG units; it scales to the width of its box.
WIDTH = 600
HEIGHT = 190
LEFT = 52
RIGHT = 10
TOP = 10
BOTTOM = 24


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    values: Sequence[float | None]


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Line:
    color: str
    name: str
    #: ``points`` attribute of each unbroken run of values (gaps split it).
    paths: list[str]
    #: Each value's mark: (x, y, hover text).
    dots: list[tuple[float, float, str]]


@dataclass(frozen=True)
class LegendEntry:
    name: str
    color: str
    summary: str


@dataclass
class Chart:
    title: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    rects: list[Rect] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    legend: list[LegendEntry] = field(default_factory=list)
    empty: bool = True
    #: What the chart shows, for screen readers.
    description: str = ""


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return float(step * power)
    return 10.0 * power


def tick_intervals(top_value: float) -> int:
    """How many steps divide a ``nice_ceiling`` into round ones: 1 in fifths
    (0.2), 2 in quarters (0.5), 5 in fifths (1)."""
    leading = round(top_value / 10 ** math.floor(math.log10(top_value)))
    return 4 if leading == 2 else 5


def format_count(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def format_seconds(seconds: float) -> str:
    """A duration at a useful precision: 850 ms, 4.2 s, 8 s, 3.5 min, 2.0 h."""
    if seconds == 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 and seconds != int(seconds) else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _time_label(at: datetime) -> str:
    return timezone.localtime(at).strftime("%H:%M")


def _frame(
    chart: Chart, starts: Sequence[datetime], step: timedelta, top_value: float, fmt: Callable[[float], str]
) -> None:
    """The axes: y ticks from 0 to ``top_value`` on round steps, and about six time labels."""
    span = chart.bottom - chart.top
    intervals = tick_intervals(top_value)
    chart.y_ticks = [
        Tick(chart.bottom - span * i / intervals, fmt(top_value * i / intervals)) for i in range(intervals + 1)
    ]
    every = max(1, math.ceil(len(starts) / 6))
    # Labels on round times: whole multiples of the label spacing.
    spacing = step * every
    epoch = datetime(1970, 1, 1, tzinfo=starts[0].tzinfo)
    width = (chart.right - chart.left) / len(starts)
    chart.x_ticks = [
        Tick(chart.left + width * i, _time_label(at))
        for i, at in enumerate(starts)
        if (at - epoch) % spacing == timedelta(0)
    ]


def stacked_bars(
    title: str, starts: Sequence[datetime], step: timedelta, series: Sequence[Series], *, per: timedelta | None = None
) -> Chart:
    """Bars of counts per bucket, one colour per series, stacked. ``per``
    scales the counts to a rate (per minute) when a bucket is longer."""
    scale = per / step if per else 1.0
    chart = Chart(title=title)
    totals = [sum(float(s.values[i] or 0) for s in series) * scale for i in range(len(starts))]
    top_value = nice_ceiling(max(totals, default=0))
    _frame(chart, starts, step, top_value, format_count)
    slot = (chart.right - chart.left) / len(starts)
    gap = min(1.0, slot * 0.15)
    span = chart.bottom - chart.top
    for i, at in enumerate(starts):
        base = float(chart.bottom)
        for s in series:
            value = float(s.values[i] or 0) * scale
            if not value:
                continue
            height = span * value / top_value
            base -= height
            label = f"{_time_label(at)}: {format_count(value)} {s.name}"
            chart.rects.append(Rect(chart.left + slot * i + gap / 2, base, slot - gap, height, s.color, label))
    chart.empty = not any(totals)
    chart.legend = [LegendEntry(s.name, s.color, format_count(sum(float(v or 0) for v in s.values))) for s in series]
    chart.description = f"{title}: " + ", ".join(f"{e.name} {e.summary}" for e in chart.legend)
    return chart


def lines(
    title: str, starts: Sequence[datetime], step: timedelta, series: Sequence[Series], summaries: Sequence[str]
) -> Chart:
    """One line per series of durations in seconds; a missing value breaks
    its line. ``summaries``: each series' legend text."""
    chart = Chart(title=title)
    values = [v for s in series for v in s.values if v is not None]
    top_value = nice_ceiling(max(values, default=0))
    _frame(chart, starts, step, top_value, format_seconds)
    slot = (chart.right - chart.left) / len(starts)
    span = chart.bottom - chart.top
    for s in series:
        runs: list[list[str]] = [[]]
        dots: list[tuple[float, float, str]] = []
        for i, value in enumerate(s.values):
            if value is None:
                if runs[-1]:
                    runs.append([])
                continue
            x = chart.left + slot * (i + 0.5)
            y = chart.bottom - span * value / top_value
            runs[-1].append(f"{x:.1f},{y:.1f}")
            dots.append((x, y, f"{_time_label(starts[i])}: {s.name} {format_seconds(value)}"))
        chart.lines.append(Line(s.color, s.name, [" ".join(run) for run in runs if run], dots))
    chart.empty = not values
    chart.legend = [LegendEntry(s.name, s.color, summary) for s, summary in zip(series, summaries, strict=True)]
    chart.description = f"{title}: " + ", ".join(f"{e.name} {e.summary}" for e in chart.legend)
    return chart
