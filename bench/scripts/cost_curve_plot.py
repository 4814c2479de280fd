#!/usr/bin/env python3
"""The cost curve's plot (docs/cost-curve.svg) from cost_curve.sh's results.

Two panels against the document count (log scale): each phase's ops/s, and its disk
reads per operation (log scales both); Kiln's lines solid, PostgreSQL's dashed (when
the results hold its rows). Plain SVG, no dependencies:
    python3 bench/scripts/cost_curve_plot.py /work/curve-results/curve-*.json > docs/cost-curve.svg
"""
import json
import math
import sys

PHASES = ["GET", "PUT", "YB", "QUERY"]
COLORS = {"GET": "#1f77b4", "PUT": "#d62728", "YB": "#2ca02c", "QUERY": "#9467bd"}


DASH = {"kiln": "", "postgres": ' stroke-dasharray="6 4"'}


def points(paths):
    by_phase = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for row in doc["documents"]["rows"]:
            if row.get("workload") != "CURVE":
                continue
            n = row["documents"]
            engine = row.get("engine", "kiln")
            for ph in row["phases"]:
                by_phase.setdefault((engine, ph["phase"]), []).append(
                    (n, ph["ops_per_sec"], max(ph["disk_read_bytes_per_op"], 1.0))
                )
    for p in by_phase.values():
        p.sort()
    return by_phase


def panel(out, x0, y0, w, h, title, series, xs, ylabel):
    ys = [y for pts in series.values() for _, y in pts]
    if not ys or not xs:
        return
    lx = (math.log10(min(xs)) - 0.2, math.log10(max(xs)) + 0.2)
    ly = (math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys))))
    if ly[0] == ly[1]:
        ly = (ly[0] - 1, ly[1] + 1)

    def sx(v):
        return x0 + (math.log10(v) - lx[0]) / (lx[1] - lx[0]) * w

    def sy(v):
        return y0 + h - (math.log10(v) - ly[0]) / (ly[1] - ly[0]) * h

    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-weight="bold">{title}</text>')
    for e in range(ly[0], ly[1] + 1):
        y = sy(10 ** e)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    for n in xs:
        x = sx(n)
        label = f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k"
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 16}" text-anchor="middle">{label}</text>')
    out.append(
        f'<text x="{x0 - 44}" y="{y0 + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 {x0 - 44} {y0 + h / 2})">{ylabel}</text>'
    )
    for (engine, ph), pts in series.items():
        if not pts:
            continue
        path = " ".join(f"{sx(n):.1f},{sy(y):.1f}" for n, y in pts)
        dash = DASH.get(engine, "")
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{COLORS[ph]}" stroke-width="2"{dash}/>'
        )
        for n, y in pts:
            out.append(f'<circle cx="{sx(n):.1f}" cy="{sy(y):.1f}" r="3" fill="{COLORS[ph]}"/>')


def main():
    by_phase = points(sys.argv[1:])
    xs = sorted({n for pts in by_phase.values() for n, _, _ in pts})
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="900" height="360" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    ops = {p: [(n, o) for n, o, _ in pts] for p, pts in by_phase.items()}
    reads = {p: [(n, r) for n, _, r in pts] for p, pts in by_phase.items()}
    panel(out, 80, 40, 320, 260, "ops/s (16 clients, 2 GiB cgroup)", ops, xs, "ops/s")
    panel(out, 530, 40, 320, 260, "disk bytes read per operation", reads, xs, "bytes/op")
    for i, ph in enumerate(PHASES):
        out.append(f'<rect x="{80 + i * 90}" y="335" width="12" height="12" fill="{COLORS[ph]}"/>')
        out.append(f'<text x="{96 + i * 90}" y="346">{ph}</text>')
    out.append('<text x="450" y="346">documents (log scale); solid Kiln, dashed PostgreSQL</text>')
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
