"""Small SVG drawing kit for reports and sweep plots: no dependencies, text out.

Coordinates are SVG user units (pixels at 100 % zoom). Every element can carry a ``tip`` that
becomes an SVG ``<title>`` (the browser's native tooltip) and ``data`` attributes for scripts.
"""

from __future__ import annotations

import math
from html import escape

# Okabe & Ito (2008), "Color Universal Design": eight colours distinguishable with the common
# forms of colour blindness; cycled, then varied in lightness.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
             "#000000")


_RENAME = {"cls": "class", "dash": "stroke-dasharray"}


def _attrs(kw: dict) -> str:
    out = []
    for k, v in kw.items():
        if v is None:
            continue
        name = _RENAME.get(k) or k.rstrip("_").replace("_", "-")
        if isinstance(v, float):
            v = f"{v:.2f}".rstrip("0").rstrip(".")
        out.append(f'{name}="{escape(str(v))}"')
    return " ".join(out)


def num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


class Svg:
    """An SVG document built element by element; ``str()`` gives the markup."""

    def __init__(self, width: float, height: float, *, label: str = "", id_: str | None = None):
        self.width, self.height = width, height
        self.parts: list[str] = []
        self.label, self.id = label, id_

    def _add(self, tag: str, tip: str | None, body: str | None = None, **kw):
        inner = (f"<title>{escape(tip)}</title>" if tip else "") + (body or "")
        a = _attrs(kw)
        self.parts.append(f"<{tag} {a}>{inner}</{tag}>" if inner else f"<{tag} {a}/>")

    def rect(self, x, y, w, h, fill, *, tip=None, **kw):
        self._add("rect", tip, x=float(x), y=float(y), width=float(max(w, 0.0)),
                  height=float(max(h, 0.0)), fill=fill, **kw)

    def line(self, x1, y1, x2, y2, stroke="#444", *, width=1.0, tip=None, **kw):
        self._add("line", tip, x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2),
                  stroke=stroke, stroke_width=float(width), **kw)

    def polyline(self, points, stroke, *, width=1.5, tip=None, **kw):
        pts = " ".join(f"{num(x)},{num(y)}" for x, y in points)
        self._add("polyline", tip, points=pts, fill="none", stroke=stroke,
                  stroke_width=float(width), **kw)

    def circle(self, x, y, r, fill, *, tip=None, **kw):
        self._add("circle", tip, cx=float(x), cy=float(y), r=float(r), fill=fill, **kw)

    def text(self, x, y, s, *, size=11, anchor="start", weight=None, fill="#222", **kw):
        self._add("text", None, escape(str(s)), x=float(x), y=float(y), font_size=size,
                  text_anchor=anchor, font_weight=weight, fill=fill, **kw)

    def open(self, tag: str = "g", **kw):
        self.parts.append(f"<{tag} {_attrs(kw)}>")

    def close(self, tag: str = "g"):
        self.parts.append(f"</{tag}>")

    def __str__(self) -> str:
        head = _attrs({"xmlns": "http://www.w3.org/2000/svg", "width": num(self.width),
                       "height": num(self.height),
                       "viewBox": f"0 0 {num(self.width)} {num(self.height)}",
                       "role": "img", "aria-label": self.label or None, "id": self.id,
                       "font-family": "system-ui, sans-serif"})
        return f"<svg {head}>" + "".join(self.parts) + "</svg>"


def colour(i: int) -> str:
    """The ``i``-th categorical colour (Okabe-Ito, lighter or darker after each cycle)."""
    base = OKABE_ITO[i % len(OKABE_ITO)]
    cycle = i // len(OKABE_ITO)
    if cycle == 0:
        return base
    return shade(base, (0.45, -0.35, 0.7, -0.6)[(cycle - 1) % 4])


def shade(hex_colour: str, amount: float) -> str:
    """Mix towards white (``amount`` > 0) or black (< 0) by ``|amount|``."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    target = 255 if amount > 0 else 0
    a = abs(amount)
    return "#" + "".join(f"{round(c + (target - c) * a):02x}" for c in (r, g, b))


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values from at most ``lo`` to at least ``hi``."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    out, v = [round(start, 12)], start
    while v < hi - step * 1e-9:
        v += step
        out.append(round(v, 12))
    return out


def fmt_tick(v: float) -> str:
    """Short label for an axis tick: 1,024, 250k, 20M, 0.25."""
    a = abs(v)
    if a < 1e5 and float(v).is_integer():
        return f"{int(v):,}"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def legend(svg: Svg, x: float, y: float, entries: list[tuple[str, str]], *, per_row: int = 6,
           col_width: float = 130.0):
    """Colour swatches with labels, ``per_row`` to a row, starting at (x, y)."""
    for i, (label, fill) in enumerate(entries):
        cx, cy = x + (i % per_row) * col_width, y + (i // per_row) * 16
        svg.rect(cx, cy - 9, 10, 10, fill)
        svg.text(cx + 14, cy, label, size=10)


NARROW = 0.2
"""A line chart's points whose spread is under this share of their largest get a y axis that
spans them rather than one from 0 (``line_chart``)."""


def line_chart(series: list[tuple[str, list[tuple[float, float]]]], *, title: str,
               xlabel: str, ylabel: str, logx: bool = False, width: float = 640,
               height: float = 360, per_row: int = 3) -> Svg:
    """One polyline with markers per named series of (x, y) points; the legend ``per_row``
    names to a row. The y axis starts at 0 unless the points' spread is under ``NARROW`` of their
    largest: then it spans them, and says where it starts (a datacenter trial's network designs
    differed by 1-2 %, flat lines on an axis from 0)."""
    left, right, top, bottom = 64.0, 16.0, 28.0, 48.0
    legend_rows = math.ceil(len(series) / per_row)
    svg = Svg(width, height + 16 * legend_rows, label=title)
    pts = [p for _, s in series for p in s]
    xs = [math.log2(x) if logx else x for x, _ in pts] or [0.0, 1.0]
    ys = [y for _, y in pts] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    # ticks at the values drawn when they are few (a sweep's GPU counts), else round ones with
    # the axis widened to hold them all
    drawn = sorted({x for x, _ in pts})
    if logx or 1 < len(drawn) <= 8:
        xt = drawn
    else:
        xt = ticks(x0, x1)
        x0, x1 = xt[0], xt[-1]
    zoomed = min(ys) > 0 and max(ys) - min(ys) < NARROW * max(ys)
    yt = ticks(min(ys) if zoomed or min(ys) < 0 else 0.0, max(ys))
    y0, y1 = yt[0], yt[-1]
    zoomed = zoomed and y0 > 0  # (round ticks reached 0 anyway: an axis from 0, said as such)
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        v = math.log2(x) if logx else x
        return left + (v - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / ((y1 - y0) or 1.0) * ph

    svg.text(left, 16, title, size=13, weight="600")
    for t in yt:
        svg.line(left, py(t), left + pw, py(t), "#e4e4e4")
        svg.text(left - 6, py(t) + 4, fmt_tick(t), size=10, anchor="end")
    for t in xt:
        svg.text(px(t), top + ph + 16, fmt_tick(t), size=10, anchor="middle")
    svg.line(left, top + ph, left + pw, top + ph)
    svg.line(left, top, left, top + ph)
    svg.text(left + pw / 2, top + ph + 34, xlabel, size=11, anchor="middle")
    svg.text(14, top + ph / 2, ylabel + (f" (axis from {fmt_tick(y0)}, not 0)" if zoomed else ""),
             size=11, anchor="middle", transform=f"rotate(-90 14 {num(top + ph / 2)})")
    for i, (name, s) in enumerate(series):
        c = colour(i)
        s = sorted(s)
        if len(s) > 1:
            svg.polyline([(px(x), py(y)) for x, y in s], c)
        for x, y in s:
            svg.circle(px(x), py(y), 3, c, tip=f"{name}: x={x:g}, y={_tip_number(y)}")
    legend(svg, left, height + 4, [(n, colour(i)) for i, (n, _) in enumerate(series)],
           per_row=per_row, col_width=pw / per_row)
    return svg


def _tip_number(y: float) -> str:
    """A point's value as its tooltip shows it: whole with thousands separators from 1,000 on,
    four significant digits below (a NEST-paper trial's tooltips mixed "1.326e+04" with "9,449")."""
    return f"{y:,.0f}" if abs(y) >= 1000 else f"{y:.4g}"
