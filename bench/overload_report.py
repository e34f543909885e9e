#!/usr/bin/env python3
"""bench/overload_report.py WORK FRONT...: the tables of bench/overload.sh from its raw files
(per front: FRONT.json from examples/open_loop.rs, FRONT.cpu with the front's CPU nanoseconds
at the phase boundaries; params.json and meta.txt of the run). Prints markdown."""
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
fronts = sys.argv[2:]
params = json.loads((work / "params.json").read_text())
meta = (work / "meta.txt").read_text().strip().splitlines()


def load(front):
    report = json.loads((work / f"{front}.json").read_text())
    cpu = [int(x) for x in (work / f"{front}.cpu").read_text().split()]
    return report, cpu


def refused(summary):
    """Answers the front refused: 503 (shed), 429 (a static concurrency limit)."""
    return summary["shed"] + summary["other_statuses"].get("429", 0)


def others(summary):
    return summary["other"] - summary["other_statuses"].get("429", 0) + summary["failed"]


def back_in(report, phase_index, good):
    """Seconds from the phase's start until `good` holds for 1 s of buckets in a row."""
    bucket = report["bucket_ms"] / 1000
    start_s = sum(p["seconds"] for p in report["phases"][:phase_index])
    end_s = start_s + report["phases"][phase_index]["seconds"]
    series = report["series"]
    need = round(1 / bucket)
    first = round(start_s / bucket)
    last = round(end_s / bucket)
    run = 0
    for i in range(first, min(last, len(series))):
        run = run + 1 if good(series[i], bucket) else 0
        if run == need:
            return (i + 1 - need - first) * bucket
    return None


def fmt_s(x):
    return "never" if x is None else f"{x:.2f} s"


def cpu_us(report, cpu, index):
    sent = report["phases"][index]["classes"]["all"]["sent"]
    if not any(cpu) or sent == 0:
        return "–"
    return f"{(cpu[index + 1] - cpu[index]) / 1000 / sent:.1f}"


def ms(x):
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def pct(part, whole):
    return f"{100 * part / whole:.1f} %" if whole else "–"


data = {front: load(front) for front in fronts if (work / f"{front}.json").exists()}
cap = params["capacity"]
dcap = params["degraded_capacity"]
print(f"## Overload ({meta[0].removeprefix('date ')})")
print()
for line in meta[1:]:
    print(f"- {line}")
print()

first = next(iter(data.values()))[0] if data else {"phases": []}
recover = len(first["phases"]) >= 6  # the burst and the half load after it were run

for index, name, capacity in [(1, "steady", cap), (2, "degraded", dcap)] + (
        [(4, "burst on the restored app", cap)] if recover else []):
    settle = next(iter(data.values()))[0]["phases"][index]["settle_seconds"] if data else 0
    print(f"### {name}: {params['over_rate']}/s offered, app capacity {capacity}/s "
          f"(the phase without its first {settle:g} s)")
    print()
    degraded = name == "degraded"
    # What the app itself serves at most on this node: tollgate-limit64 keeps its queue full
    # the whole phase (on a busy node the app's own timers run late, so below its capacity).
    saturated = data.get("tollgate-limit64")
    best = saturated[0]["phases"][index]["settled"]["all"]["goodput_per_s"] if saturated else 0
    print("| front | goodput (% of capacity) |" + (" ÷ saturated app |" if best else "")
          + " p50 ms | p99 ms | refused | timeouts | other |"
          + (" back ≥ 90 % in |" if degraded else "") + " high ok | CPU µs/req |")
    print("|---|---:|" + ("---:|" if best else "") + "---:|---:|---:|---:|---:|"
          + ("---:|" if degraded else "") + "---:|---:|")
    for front, (report, cpu) in data.items():
        s = report["phases"][index]["settled"]["all"]
        high = report["phases"][index]["settled"].get("high")
        row = f"| {front} | {100 * s['goodput_per_s'] / capacity:.0f} % |"
        if best:
            row += f" {100 * s['goodput_per_s'] / best:.1f} % |"
        row += (f" {ms(s['p50_ms'])} | "
                f"{ms(s['p99_ms'])} | {refused(s):,} | {s['timeouts']:,} | {others(s):,} |")
        if degraded:
            row += " " + fmt_s(back_in(report, index,
                                       lambda b, w: b["ok"] / w >= 0.9 * capacity)) + " |"
        row += f" {pct(high['ok'], high['sent']) if high else '–'} | {cpu_us(report, cpu, index)} |"
        print(row)
    print()

for index, name in [(0, "half load, healthy app"), (3, "half load, app restored")] + (
        [(5, "half load after the burst (recover)", )] if recover else []):
    print(f"### {name}: {params['half_rate']}/s offered, app capacity {cap}/s (the whole phase)")
    print()
    restored = index in (3, 5)
    print("| front | ok of sent | refused (false sheds) | timeouts | other | p50 ms | p99 ms |"
          + (" all ok again in |" if restored else "") + " CPU µs/req |")
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if restored else "") + "---:|")
    for front, (report, cpu) in data.items():
        s = report["phases"][index]["classes"]["all"]
        row = (f"| {front} | {pct(s['ok'], s['sent'])} | {refused(s):,} of {s['sent']:,} | "
               f"{s['timeouts']:,} | {others(s):,} | {ms(s['p50_ms'])} | {ms(s['p99_ms'])} |")
        if restored:
            row += " " + fmt_s(back_in(report, index,
                                       lambda b, w: b["sent"] > 0 and b["ok"] == b["sent"])) + " |"
        row += f" {cpu_us(report, cpu, index)} |"
        print(row)
    print()

print("### Admitted latency against unloaded")
print()
print("Each front's own p99 at half load with a healthy app (unloaded), and the p99 of what it")
print("admitted at 3× (steady, degraded) as a multiple of it:")
print()
print("| front | unloaded p99 ms | steady p99 ms | × unloaded | degraded p99 ms | × unloaded |")
print("|---|---:|---:|---:|---:|---:|")
for front, (report, cpu) in data.items():
    u = report["phases"][0]["classes"]["all"]["p99_ms"]
    s = report["phases"][1]["settled"]["all"]["p99_ms"]
    d = report["phases"][2]["settled"]["all"]["p99_ms"]

    def times(x):
        return f"{x / u:.1f}×" if u and x else "–"

    print(f"| {front} | {ms(u)} | {ms(s)} | {times(s)} | {ms(d)} | {times(d)} |")


if recover:
    print("### Recover: requests not served (shed, timed out, failed) at half load after the burst, by time since its end")
    print()
    print("| front | 0–0.25 s | 0.25–2 s | 2–5 s | 5 s to the end | after 2 s: ok of sent |")
    print("|---|---:|---:|---:|---:|---:|")
    for front, (report, cpu) in data.items():
        bucket = report["bucket_ms"] / 1000
        start_s = sum(p["seconds"] for p in report["phases"][:5])
        end_s = start_s + report["phases"][5]["seconds"]
        series = report["series"]

        def window(a, b):
            lo, hi = round((start_s + a) / bucket), round(min(start_s + b, end_s) / bucket)
            part = series[lo:hi]
            return (sum(x["sent"] - x["ok"] for x in part), sum(x["sent"] for x in part),
                    sum(x["ok"] for x in part))

        r0, _, _ = window(0, 0.25)
        r02, _, _ = window(0.25, 2)
        r25, _, _ = window(2, 5)
        r5, _, _ = window(5, end_s - start_s)
        _, sent2, ok2 = window(2, end_s - start_s)
        print(f"| {front} | {r0:,} | {r02:,} | {r25:,} | {r5:,} | {pct(ok2, sent2)} |")
    print()

loads = {f: (work / f"{f}.load").read_text().split() for f in data if (work / f"{f}.load").exists()}
if loads:
    print("Load average (1 min) at the start and end of each front's run: "
          + ", ".join(f"{f} {a}–{b}" for f, (a, b) in loads.items()) + ".")
