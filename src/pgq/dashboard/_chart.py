"""The throughput chart, drawn on the server as SVG: no script, no chart library."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from pgq._db.inspect import Minute

WIDTH, HEIGHT = 760, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 14, 28
#: Series from the bottom of each bar up: (field, CSS class, legend).
SERIES = (
    ("completed", "bar-completed", "completed"),
    ("discarded", "bar-discarded", "failed (discarded)"),
    ("cancelled", "bar-cancelled", "cancelled"),
)


def nice_ceiling(value: int) -> int:
    """The axis top: four times the smallest of 1, 2, 5 × 10ⁿ that reaches ``value`` in four
    steps, so every grid line falls on a whole, round number."""
    scale = 1
    while True:
        for m in (1, 2, 5):
            if 4 * m * scale >= value:
                return 4 * m * scale
        scale *= 10


def throughput_svg(minutes: Sequence[Minute]) -> Markup:
    """Stacked bars of jobs finished per minute, oldest on the left, with axes, grid lines
    and a tooltip per minute."""
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    top = nice_ceiling(max((m.completed + m.discarded + m.cancelled for m in minutes), default=0))
    slot = plot_w / max(len(minutes), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="jobs finished per minute, last {len(minutes)} minutes">'
    ]
    for i in range(5):  # grid lines and the y axis labels
        value = top * i / 4
        y = _TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{value:,.0f}</text>"
        )
    for i, m in enumerate(minutes):
        parts.append(_bar(m, _LEFT + i * slot, slot, plot_h, top))
        if i % 10 == 0 or i == len(minutes) - 1:
            x = _LEFT + i * slot + slot / 2
            parts.append(
                f'<text class="axis" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                f"{escape(m.minute.strftime('%H:%M'))}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def _bar(m: Minute, x: float, slot: float, plot_h: float, top: int) -> str:
    label = escape(
        f"{m.minute:%H:%M} UTC: {m.completed:,} completed, {m.discarded:,} failed, "
        f"{m.cancelled:,} cancelled"
    )
    out = [f"<g><title>{label}</title>"]
    # An invisible full-height target, so a minute with nothing shows its tooltip too.
    out.append(
        f'<rect class="bar-hit" x="{x:.1f}" y="{_TOP}" width="{slot:.1f}" height="{plot_h:.1f}"/>'
    )
    base = _TOP + plot_h
    for name, css, _legend in SERIES:
        h = plot_h * getattr(m, name) / top
        if h > 0:
            base -= h
            out.append(
                f'<rect class="{css}" x="{x + 1:.1f}" y="{base:.1f}" '
                f'width="{max(slot - 2, 1):.1f}" height="{h:.1f}"/>'
            )
    out.append("</g>")
    return "".join(out)
