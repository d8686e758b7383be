#!/usr/bin/env python3
"""Draws bench/scripts/scale.sh's RSS samples (t_s,rss_kib,phase CSV) as an
SVG line chart, with the phases as labelled bands. Standard library only.

    python3 bench/scripts/plot_rss.py rss.csv rss.svg
"""
import csv
import sys


def main(src, dst):
    rows = []
    with open(src) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["t_s"]), int(r["rss_kib"] or 0) / 1024.0, r["phase"]))
    if not rows:
        sys.exit(f"{src}: no samples")
    w, h, ml, mr, mt, mb = 900, 420, 70, 20, 30, 50
    t0, t1 = rows[0][0], max(rows[-1][0], rows[0][0] + 1)
    ymax = max(r[1] for r in rows) * 1.1 or 1.0
    x = lambda t: ml + (t - t0) * (w - ml - mr) / (t1 - t0)
    y = lambda v: h - mb - v * (h - mt - mb) / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{ml}" y="18" font-size="13">broker RSS (MiB) over time (s)</text>']
    # Phase bands.
    start, cur, shade = rows[0][0], rows[0][2], 0
    bands = []
    for t, _, p in rows[1:] + [(t1, 0, None)]:
        if p != cur:
            bands.append((start, t, cur))
            start, cur = t, p
    for a, b, p in bands:
        shade ^= 1
        out.append(f'<rect x="{x(a):.1f}" y="{mt}" width="{max(x(b) - x(a), 0):.1f}" height="{h - mt - mb}" '
                   f'fill="{"#eef3fb" if shade else "#ffffff"}"/>')
        out.append(f'<text x="{x(a) + 2:.1f}" y="{mt + 12}" fill="#557">{p}</text>')
    # Axes and ticks.
    out.append(f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>')
    out.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>')
    for i in range(6):
        v = ymax * i / 5
        out.append(f'<text x="{ml - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        t = t0 + (t1 - t0) * i / 5
        out.append(f'<text x="{x(t):.1f}" y="{h - mb + 16}" text-anchor="middle">{t - t0:.0f}</text>')
    pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v, _ in rows)
    out.append(f'<polyline points="{pts}" fill="none" stroke="#c03" stroke-width="1.5"/>')
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
