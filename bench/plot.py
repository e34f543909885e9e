#!/usr/bin/env python3
"""Draws bench/run.sh's results as two SVG bar charts (Python standard library only).

Usage: bench/plot.py RESULTS.md [OUT_DIR]

RESULTS.md is what bench/run.sh prints and keeps as bench/results/<stamp>.md (report.py's
Markdown): its first table, the one whose header starts `| scenario | server |`, is read by
column name, so a file that keeps only some of report.py's columns reads as well (the results
committed under docs/performance/ do). Used columns: scenario, server, and any of req/s,
CPU µs / req, user, sys, Redis CPU µs / req, req/s ÷ nginx. A cell that is empty or `-` is
unknown. The first `# ` line of the file is the charts' subtitle.

Writes OUT_DIR/<name>-cpu.svg (CPU µs per request: the server's user and system time where
the file splits it, and Redis's CPU for tollgate and the exact floor) and
OUT_DIR/<name>-throughput.svg (req/s, or req/s ÷ nginx when the file has no absolute req/s),
one bar per server, grouped by scenario, in the file's order. OUT_DIR defaults to the
directory of RESULTS.md; <name> is its file name without `.md`. The output depends on the
file alone, so the same file always gives the same bytes.
"""

import math
import os
import re
import sys
from xml.sax.saxutils import escape

# What a server of bench/run.sh is called on the charts; scenario 0 has no limits, so there
# "tollgate" is the plain proxy and "hyper-floor" the plain floor.
NAMES = {
    "tollgate": "tollgate, exact",
    "tollgate-sync": "tollgate, local-first",
    "tollgate-log": "tollgate, exact, access log",
    "tollgate-coalesce": "tollgate, exact, coalesce",
    "hyper-floor": "exact floor",
    "nginx-proxy": "nginx proxy_pass",
    "nginx-proxy-fwd": "nginx proxy_pass, same work",
    "nginx-limit_req": "nginx limit_req",
    "haproxy": "HAProxy",
    "envoy": "Envoy",
    "upstream": "upstream, directly",
}
NAMES_PLAIN = {"tollgate": "tollgate", "hyper-floor": "hyper floor"}
COLOURS = {  # (user or whole, system) per kind of server
    "tollgate-sync": ("#138d90", "#86cfd1"),
    "tollgate": ("#1f5fa8", "#7fa9db"),
    "hyper-floor": ("#2e8b57", "#8fcca8"),
    "nginx": ("#555555", "#aaaaaa"),
    "haproxy": ("#c0661a", "#eab489"),
    "envoy": ("#7b4ea3", "#c3a9dc"),
    "upstream": ("#8c8c8c", "#cfcfcf"),
}
REDIS_COLOUR = "#d13b3b"

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
WIDTH = 820
LABEL_X = 16  # server labels start here
PLOT_X0 = 250  # bars start here
PLOT_X1 = 650  # the axis ends here; value labels may run past it
ROW = 22
BAR = 14
GROUP_GAP = 10


def number(cell: str):
    """The leading number of a cell ("102,460", "0.96× (0.95–0.97)", "16.0"), or None."""
    m = re.match(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)", cell or "")
    return float(m.group(1).replace(",", "")) if m else None


def read(path: str):
    """(title, columns, rows): rows are dicts of column name -> cell text. report.py's line
    "tollgate-sync: every limit `sync: 100ms` ..." names tollgate-sync's interval."""
    title = ""
    header, rows = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not title and line.startswith("# "):
                title = line[2:].strip()
            sync = re.match(r"tollgate-sync: every limit `sync: ([^`]+)`", line)
            if sync:
                NAMES["tollgate-sync"] = f"tollgate, sync: {sync.group(1)}"
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                if line.startswith("|") and cells[:2] == ["scenario", "server"]:
                    header = cells
                continue
            if not line.startswith("|"):
                break
            if set(line.replace("|", "").strip()) <= set("-: "):
                continue  # the separator row
            rows.append(dict(zip(header, cells)))
    if header is None:
        sys.exit(f"{path}: no table with `| scenario | server |` header")
    return title, header, rows


def kind(server: str) -> str:
    for k in ("tollgate-sync", "tollgate", "hyper-floor", "nginx", "haproxy", "envoy", "upstream"):
        if server.startswith(k):
            return k
    return "upstream"


def scenario_label(s: str) -> str:
    """ "1 allowed (gcra by header, ...)" -> "scenario 1: allowed (gcra by header, ...)" """
    num, _, rest = s.partition(" ")
    return f"scenario {num}: {rest}" if num.isdigit() else s


def server_label(scenario: str, server: str) -> str:
    if scenario.split(" ")[0] == "0" and server in NAMES_PLAIN:
        return NAMES_PLAIN[server]
    return NAMES.get(server, server)


def nice_axis(top: float):
    """Axis end and tick step: about five ticks of 1, 2, 2.5 or 5 times a power of ten."""
    if top <= 0:
        return 1.0, 0.2
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return math.ceil(top / step - 1e-9) * step, step


def fmt(v: float, digits: int) -> str:
    return f"{v:,.{digits}f}"


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#222", halo=False):
    """A text element; with `halo`, a white outline keeps it legible over grid lines."""
    outline = ' stroke="#ffffff" stroke-width="3" paint-order="stroke"' if halo else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}" fill="{fill}"{outline}>{escape(s)}</text>'
    )


def chart(title, subtitle, groups, axis_label, legend, baseline=None):
    """groups: [(scenario label, [(server label, kind, [(value, colour)], value text)])]."""
    top = max((sum(v for v, _ in segs) for _, bars in groups for _, _, segs, _ in bars), default=0)
    if baseline is not None:
        top = max(top, baseline) * 1.15  # room past the baseline for the value labels
    end, step = nice_axis(top)
    scale = (PLOT_X1 - PLOT_X0) / end
    y = 62 + (20 if legend else 0)
    body = []
    first_bar_y = y + ROW - 4  # grid lines start below the first heading
    for label, bars in groups:
        body.append(text(LABEL_X, y + 14, label, 12, weight="bold", halo=True))
        y += ROW
        for name, _, segs, value in bars:
            body.append(text(PLOT_X0 - 8, y + BAR - 3, name, 12, anchor="end"))
            x = PLOT_X0
            for v, colour in segs:
                w = v * scale
                body.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR}" fill="{colour}"/>'
                )
                x += w
            body.append(text(x + 5, y + BAR - 3, value, 11, halo=True))
            y += ROW
        y += GROUP_GAP
    last_bar_y = y - GROUP_GAP
    axis = []
    tick = 0.0
    while tick <= end + 1e-9:
        x = PLOT_X0 + tick * scale
        axis.append(
            f'<line x1="{x:.1f}" y1="{first_bar_y:.1f}" x2="{x:.1f}" y2="{last_bar_y:.1f}" '
            f'stroke="#e2e2e2" stroke-width="1"/>'
        )
        label = fmt(tick, 0) if step >= 1 else f"{round(tick, 6):g}"
        axis.append(text(x, last_bar_y + 16, label, 11, anchor="middle"))
        tick += step
    axis.append(
        f'<line x1="{PLOT_X0}" y1="{first_bar_y:.1f}" x2="{PLOT_X0}" y2="{last_bar_y:.1f}" '
        f'stroke="#444" stroke-width="1"/>'
    )
    axis.append(
        f'<line x1="{PLOT_X0}" y1="{last_bar_y:.1f}" x2="{PLOT_X1}" y2="{last_bar_y:.1f}" '
        f'stroke="#444" stroke-width="1"/>'
    )
    if baseline is not None:
        x = PLOT_X0 + baseline * scale
        axis.append(
            f'<line x1="{x:.1f}" y1="{first_bar_y:.1f}" x2="{x:.1f}" y2="{last_bar_y:.1f}" '
            f'stroke="#444" stroke-width="1" stroke-dasharray="4 3"/>'
        )
    axis.append(text((PLOT_X0 + PLOT_X1) / 2, last_bar_y + 36, axis_label, 12, anchor="middle"))
    height = last_bar_y + 52
    head = [text(LABEL_X, 24, title, 16, weight="bold"), text(LABEL_X, 44, subtitle, 12, fill="#555")]
    x = LABEL_X
    for name, colour in legend:
        head.append(f'<rect x="{x:.1f}" y="56" width="12" height="12" fill="{colour}"/>')
        head.append(text(x + 17, 66, name, 11))
        x += 32 + 6.3 * len(name)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
            f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="{FONT}">',
            f'<rect width="{WIDTH}" height="{height:.0f}" fill="#ffffff"/>',
            *head,
            *axis,
            *body,
            "</svg>",
            "",
        ]
    )


def grouped(rows):
    """[(scenario, [row, ...])] in the file's order."""
    out = []
    for row in rows:
        if not out or out[-1][0] != row["scenario"]:
            out.append((row["scenario"], []))
        out[-1][1].append(row)
    return out


def cpu_chart(title, rows):
    groups, split_seen, redis_seen = [], False, False
    for scenario, members in grouped(rows):
        bars = []
        for row in members:
            server = row["server"]
            whole, colours = number(row.get("CPU µs / req")), COLOURS[kind(server)]
            if whole is None:
                continue
            user, system = number(row.get("user")), number(row.get("sys"))
            redis = number(row.get("Redis CPU µs / req"))
            if user is not None and system is not None:
                segs = [(user, colours[0]), (system, colours[1])]
                value = f"{whole:.1f} ({user:.1f} + {system:.1f})"
                split_seen = True
            else:
                segs = [(whole, colours[0])]
                value = f"{whole:.1f}"
            if redis is not None and redis > 0:
                segs.append((redis, REDIS_COLOUR))
                value += f" + Redis {redis:.1f}"
                redis_seen = True
            bars.append((server_label(scenario, server), kind(server), segs, value))
        if bars:
            groups.append((scenario_label(scenario), bars))
    if split_seen:
        legend = [
            ("user time (darker)", COLOURS["tollgate"][0]),
            ("system time (lighter; each server in its own colour)", COLOURS["tollgate"][1]),
        ]
    else:
        legend = [("the server's own CPU, user + system", COLOURS["tollgate"][0])]
    if redis_seen:
        legend.append(("Redis, per request", REDIS_COLOUR))
    return chart(
        "CPU per request (lower is better)",
        title,
        groups,
        "CPU µs per request: the server's processes, user + system (and Redis's, in red)",
        legend,
    )


def throughput_chart(title, header, rows):
    absolute = "req/s" in header and any(number(r.get("req/s")) is not None for r in rows)
    groups = []
    for scenario, members in grouped(rows):
        bars = []
        for row in members:
            server = row["server"]
            colour = COLOURS[kind(server)][0]
            if absolute:
                v = number(row.get("req/s"))
                label = None if v is None else fmt(v, 0)
            else:
                v = number(row.get("req/s ÷ nginx"))
                label = None if v is None else f"{v:.2f}×"
                if v is None and server.startswith("nginx") and row.get("req/s ÷ nginx", "") == "":
                    v, label = 1.0, "1.00× (the yardstick)"
            if v is None:
                continue
            bars.append((server_label(scenario, server), kind(server), [(v, colour)], label))
        if bars:
            groups.append((scenario_label(scenario), bars))
    if absolute:
        return chart(
            "Requests per second (higher is better)",
            title,
            groups,
            "requests per second (wrk, the same load for every server)",
            [],
        )
    return chart(
        "Throughput against nginx (higher is better)",
        title,
        groups,
        "req/s ÷ nginx's in the same run (proxy_pass in scenario 0, limit_req in 1–4)",
        [],
        baseline=1.0,
    )


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: bench/plot.py RESULTS.md [OUT_DIR]")
    path = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    name = name[:-3] if name.endswith(".md") else name
    title, header, rows = read(path)
    os.makedirs(out_dir, exist_ok=True)
    for suffix, svg in (("cpu", cpu_chart(title, rows)), ("throughput", throughput_chart(title, header, rows))):
        target = os.path.join(out_dir, f"{name}-{suffix}.svg")
        with open(target, "w", encoding="utf-8", newline="\n") as f:
            f.write(svg)
        print(target)


if __name__ == "__main__":
    main()
