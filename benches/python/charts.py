"""The charts of ``BENCHMARKS.md``, made from the JSON lines the runs printed.

    python benches/python/charts.py [--results benches/results] [--out docs/charts] [--check]

Reads the runs' stdout as committed under ``--results`` and writes SVG
files under ``--out``, by hand (no plotting library, no dependency beyond
the standard library), so that anyone can make the images again from the
same lines and get the same bytes:

- ``w7.jsonl`` (``benches/python/w7.py``) -> ``w7-loader-paths.svg``: each
  loader path's samples/s, the median of its rounds as a bar and every
  round as a dot, with the goals drawn where they fall (2 x 2 workers at
  0.5 of one process, the threaded loader at 1.3 of it, both at 3 x
  Streaming's 2 x 2).
- ``w9-s3s.jsonl`` (``workload w9 --server s3s``) -> ``w9-s3s-fs.svg``:
  bytes fetched per epoch after the first (all nodes, over the dataset's
  bytes D) against the tier's budget, one line per eviction policy, and
  the floor each policy's order allows as a dashed line; one panel per
  store and node count.

``--check`` writes nothing and exits 1 when a committed image differs from
the one its lines make (or is missing).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[2]

#: One color per policy or path, the same in every chart.
COLORS = {
    "lru": "#d62728",
    "plan": "#1f77b4",
    "affine_f0": "#2ca02c",
    "affine_f0.1": "#9467bd",
    "map": "#ff7f0e",
    "floor": "#555555",
    "cachex": "#1f77b4",
    "one_process": "#7f7f7f",
    "peer": "#d62728",
    "goal": "#000000",
}
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a run's stdout, one a line (blank lines skipped)."""
    rows = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{number}: not a JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise SystemExit(f"{path}:{number}: not a JSON object")
        rows.append(row)
    return rows


def num(value: float) -> str:
    """A coordinate with two decimals at most (stable text, small files)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def si(value: float) -> str:
    """``value`` in a short human form: 950, 12.5k, 1.2M."""
    for factor, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[low, high]``."""
    span = high - low if high > low else 1.0
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if span / (step * mult) <= count:
            step *= mult
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(math.ceil((high - first) / step) + 1)]


@dataclass
class Svg:
    """An SVG document built element by element."""

    width: int
    height: int
    items: list[str] = field(default_factory=list)

    def line(
        self, x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1.0
    ) -> None:
        self.items.append(
            f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
            f'stroke="{stroke}" stroke-width="{num(width)}"/>'
        )

    def polyline(
        self, points: Sequence[tuple[float, float]], stroke: str, dashed: bool = False
    ) -> None:
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        coords = " ".join(f"{num(x)},{num(y)}" for x, y in points)
        self.items.append(
            f'<polyline points="{coords}" fill="none" stroke="{stroke}" stroke-width="2"{dash}/>'
        )

    def circle(self, x: float, y: float, r: float, fill: str) -> None:
        self.items.append(f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}" fill="{fill}"/>')

    def rect(self, x: float, y: float, w: float, h: float, fill: str, opacity: float = 1) -> None:
        alpha = f' fill-opacity="{num(opacity)}"' if opacity < 1 else ""
        self.items.append(
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" '
            f'fill="{fill}"{alpha}/>'
        )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        size: int = 12,
        anchor: str = "start",
        bold: bool = False,
        rotate: bool = False,
        fill: str = "#000000",
    ) -> None:
        weight = ' font-weight="bold"' if bold else ""
        turn = f' transform="rotate(-90 {num(x)} {num(y)})"' if rotate else ""
        self.items.append(
            f'<text x="{num(x)}" y="{num(y)}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}"{weight}{turn}>{escape(s)}</text>'
        )

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" {FONT}>'
        )
        background = f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>'
        return "\n".join([head, background, *self.items, "</svg>"]) + "\n"


@dataclass
class Axes:
    """A plot area: pixel box ``(left, top, width, height)`` and data ranges."""

    left: float
    top: float
    width: float
    height: float
    xlim: tuple[float, float]
    ylim: tuple[float, float]

    def x(self, value: float) -> float:
        low, high = self.xlim
        return self.left + (value - low) / (high - low) * self.width

    def y(self, value: float) -> float:
        low, high = self.ylim
        return self.top + self.height - (value - low) / (high - low) * self.height

    def frame(
        self,
        svg: Svg,
        xticks: Iterable[float],
        yticks: Iterable[float],
        xlabel: str,
        ylabel: str,
        title: str,
        xfmt: Callable[[float], str] = lambda v: f"{v:g}",
        yfmt: Callable[[float], str] = lambda v: f"{v:g}",
    ) -> None:
        """Grid, ticks, labels and a title around the plot area."""
        bottom, right = self.top + self.height, self.left + self.width
        for v in yticks:
            py = self.y(v)
            svg.line(self.left, py, right, py, "#e5e5e5")
            svg.text(self.left - 6, py + 4, yfmt(v), 11, "end")
        for v in xticks:
            px = self.x(v)
            svg.line(px, self.top, px, bottom, "#f0f0f0")
            svg.text(px, bottom + 16, xfmt(v), 11, "middle")
        svg.line(self.left, bottom, right, bottom, "#000000")
        svg.line(self.left, self.top, self.left, bottom, "#000000")
        svg.text((self.left + right) / 2, bottom + 34, xlabel, 12, "middle")
        svg.text(self.left - 44, self.top + self.height / 2, ylabel, 12, "middle", rotate=True)
        svg.text(self.left, self.top - 10, title, 13, bold=True)


def legend(svg: Svg, x: float, y: float, entries: Sequence[tuple[str, str, str]]) -> None:
    """Entries ``(label, color, style)`` in a row; style ``line``, ``dashed``,
    ``bar`` or ``dot``."""
    for label, color, style in entries:
        if style == "bar":
            svg.rect(x, y - 9, 18, 10, color, 0.8)
        elif style == "dot":
            svg.circle(x + 9, y - 4, 4, color)
        else:
            svg.polyline([(x, y - 4), (x + 18, y - 4)], color, dashed=style == "dashed")
        svg.text(x + 24, y, label, 12)
        x += 30 + 7 * len(label)


# --- W7: the loader paths --------------------------------------------------------------

#: W7's paths, top to bottom, with the label a reader knows them by.
W7_PATHS = (
    ("read_2x2", "2 ranks x 2 DataLoader workers"),
    ("read_2x0", "2 ranks, no workers"),
    ("read_threaded", "2 ranks, ThreadedLoader"),
    ("read_one_process", "one process, the plan's order"),
    ("streaming_2x2", "MosaicML Streaming, 2 x 2"),
)


def w7_chart(rows: list[dict[str, Any]]) -> str:
    """W7's loader paths: median samples/s a bar, each round a dot, goals marked."""
    setup = next((r for r in rows if r.get("what") == "setup"), {})
    rounds: dict[str, list[float]] = {}
    gbps: dict[str, list[float]] = {}
    for r in rows:
        what = r.get("what")
        if what in dict(W7_PATHS) and "samples_per_s" in r:
            rounds.setdefault(what, []).append(float(r["samples_per_s"]))
            gbps.setdefault(what, []).append(float(r["gb_per_s"]))
    paths = [(what, label) for what, label in W7_PATHS if what in rounds]
    if "read_one_process" not in rounds:
        raise SystemExit("w7.jsonl: no read_one_process line")
    median = {what: statistics.median(v) for what, v in rounds.items()}
    single = median["read_one_process"]
    peer = median.get("streaming_2x2")

    top, row_h, left, plot_w = 96, 58, 250, 560
    svg = Svg(left + plot_w + 330, top + row_h * len(paths) + 50)
    high = max(max(v) for v in rounds.values())
    if peer:
        high = max(high, 3 * peer)
    xlim = (0.0, ticks(0, high * 1.05)[-1])
    ax = Axes(left, top, plot_w, row_h * len(paths), xlim, (0, len(paths)))
    n = setup.get("n")
    title = "W7: samples/s of each loader path (one epoch, every byte touched)"
    svg.text(20, 26, title, 15, bold=True)
    detail = f"N = {n:,} samples of 1-64 KiB, " if isinstance(n, int) else ""
    detail += f"batches of {setup.get('batch', '?')}, "
    detail += "ragged bytes, " if setup.get("ragged") else "padded bytes, "
    detail += "the workers' batch ring; " if setup.get("ring") else ""
    detail += f"{setup.get('threads', '?')} fill thread(s) a rank; "
    detail += "bar: median of rounds, dots: rounds"
    svg.text(20, 46, detail, 12)
    ax.frame(svg, ticks(*xlim), [], "samples/s (all ranks)", "", "", xfmt=si)
    for i, (what, label) in enumerate(paths):
        y0 = top + i * row_h + 10
        color = {
            "read_one_process": COLORS["one_process"],
            "streaming_2x2": COLORS["peer"],
        }.get(what, COLORS["cachex"])
        svg.rect(ax.x(0), y0, ax.x(median[what]) - ax.x(0), row_h - 24, color, 0.75)
        for v in rounds[what]:
            svg.circle(ax.x(v), y0 + (row_h - 24) / 2, 3.5, "#000000")
        svg.text(left - 8, y0 + (row_h - 24) / 2 + 4, label, 12, "end")
        gb = statistics.median(gbps[what])
        note = f"{si(median[what])} samples/s, {gb:.2f} GB/s"
        svg.text(left + plot_w + 14, y0 + (row_h - 24) / 2 - 3, note, 11)
        if what != "read_one_process":
            ratio = f"{median[what] / single:.2f} x one process"
            svg.text(left + plot_w + 14, y0 + (row_h - 24) / 2 + 11, ratio, 11)
        goal = {"read_2x2": 0.5, "read_threaded": 1.3}.get(what)
        if goal is not None:
            gx = ax.x(goal * single)
            svg.line(gx, y0 - 4, gx, y0 + row_h - 20, COLORS["goal"], 2.5)
            svg.text(gx, y0 + row_h - 8, f"goal {goal:g} x one process", 10, "middle")
    if peer:
        px = ax.x(3 * peer)
        svg.polyline([(px, top), (px, top + row_h * len(paths))], COLORS["goal"], dashed=True)
        svg.text(px + 4, top - 6, "goal: 3 x Streaming's 2 x 2", 10)
    return svg.render()


# --- W9: bytes per epoch per policy against the floor ----------------------------------

W9_POLICIES = ("lru", "plan", "affine_f0", "affine_f0.1")


def w9_chart(rows: list[dict[str, Any]], source: str) -> str:
    """W9's budget sweep: fetched per epoch over D by policy, floors dashed."""
    lines = [
        r
        for r in rows
        if r.get("phase") == "line"
        and r.get("store") in ("pages", "segments")
        and r.get("policy") in W9_POLICIES
    ]
    if not lines:
        raise SystemExit(f"{source}: no W9 `line` lines of a budget sweep")
    server = lines[0].get("server", "?")
    panels = sorted({(r["store"], r["nodes"]) for r in lines})
    cols = 2
    pw, ph, left, top = 400, 250, 80, 110
    gap_x, gap_y = 110, 100
    nrows = math.ceil(len(panels) / cols)
    svg = Svg(left + cols * pw + (cols - 1) * gap_x + 40, top + nrows * (ph + gap_y) - 30)
    svg.text(20, 26, f"W9 on {server}: bytes fetched per epoch against the floor", 15, bold=True)
    svg.text(
        20,
        46,
        "epochs after the first, all nodes, over the dataset's bytes D; solid: fetched; "
        "dashed: the floor its order allows (a policy's color where the order is its own)",
        12,
    )
    budgets = sorted({float(r["budget_frac"]) for r in lines})
    high = max(
        max(float(r["fetched_per_epoch_ratio"]), float(r["floor_per_epoch_ratio"])) for r in lines
    )
    ylim = (0.0, ticks(0, high * 1.05)[-1])
    xlim = (min(budgets) - 0.1, max(budgets) + 0.1)
    used: set[str] = set()
    for k, (store, nodes) in enumerate(panels):
        ax = Axes(
            left + (k % cols) * (pw + gap_x),
            top + (k // cols) * (ph + gap_y),
            pw,
            ph,
            xlim,
            ylim,
        )
        title = f"{'page file' if store == 'pages' else 'segment store'}, M = {nodes} node"
        title += "s" if nodes > 1 else ""
        ax.frame(
            svg,
            budgets,
            ticks(*ylim),
            "tier budget / a node's share of D",
            "fetched per epoch / D",
            title,
        )
        series: dict[str, list[tuple[float, float, float]]] = {}
        for r in lines:
            if r["store"] == store and r["nodes"] == nodes:
                series.setdefault(r["policy"], []).append(
                    (
                        float(r["budget_frac"]),
                        float(r["fetched_per_epoch_ratio"]),
                        float(r["floor_per_epoch_ratio"]),
                    )
                )
        # Policies that read the same order share one floor: drawn once.
        floors: dict[tuple[tuple[float, float], ...], list[str]] = {}
        for policy in W9_POLICIES:
            if policy in series:
                pts = sorted(series[policy])
                key = tuple((b, round(f, 4)) for b, _, f in pts)
                floors.setdefault(key, []).append(policy)
        for key, policies in floors.items():
            color = COLORS["floor"] if len(policies) > 1 else COLORS[policies[0]]
            svg.polyline([(ax.x(b), ax.y(f)) for b, f in key], color, dashed=True)
            if len(policies) > 1:
                used.add("floor")
        for policy in W9_POLICIES:
            if policy not in series:
                continue
            used.add(policy)
            pts = sorted(series[policy])
            svg.polyline([(ax.x(b), ax.y(v)) for b, v, _ in pts], COLORS[policy])
            for b, v, _ in pts:
                svg.circle(ax.x(b), ax.y(v), 3.5, COLORS[policy])
    entries = [(p, COLORS[p], "line") for p in W9_POLICIES if p in used]
    if "floor" in used:
        entries.append(("floor of lru and plan (one order)", COLORS["floor"], "dashed"))
    legend(svg, 20, 74, entries)
    return svg.render()


# --- the driver ------------------------------------------------------------------------


def charts(results: Path) -> dict[str, str]:
    """Every chart whose lines exist under ``results``: file name -> SVG text."""
    out = {}
    w7 = results / "w7.jsonl"
    if w7.exists():
        out["w7-loader-paths.svg"] = w7_chart(read_lines(w7))
    w9 = results / "w9-s3s.jsonl"
    if w9.exists():
        out["w9-s3s-fs.svg"] = w9_chart(read_lines(w9), str(w9))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benches" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "charts")
    ap.add_argument("--check", action="store_true", help="compare with the committed images")
    args = ap.parse_args(argv)
    made = charts(args.results)
    if not made:
        print(f"no JSON lines under {args.results}", file=sys.stderr)
        return 1
    stale = []
    for name, svg in made.items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != svg:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(svg)
        print(path)
    if stale:
        print("not made from the committed lines (run charts.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
