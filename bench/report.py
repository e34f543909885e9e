#!/usr/bin/env python3
"""Turns run.sh's raw measurements into the results table (Markdown on stdout).

raw.tsv columns: scenario, server, requests, duration_us, p50_us, p99_us, non-2xx responses,
socket errors, "<redis round trips> <commands run inside scripts> <requests tollgate counted>
<tollgate CPU clock ticks> <Redis CPU microseconds>" (the last five only for tollgate), round.

With several rounds (ROUNDS=N), the first table shows each server's median round (by
requests/s) and each ratio as the median of the rounds' own ratios, with their range; the
second table adds the rounds up.
"""

import statistics
import sys

SCENARIOS = {
    "1": "1 allowed (gcra by header, 1,000 users, never trips)",
    "2": "2 denied flood (one user far over its limit)",
    "3": "3 mixed (10% of users over their limits)",
    "4": "4 three limits on one route",
}
TOLLGATE = "tollgate"


def ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def main() -> None:
    raw_path, meta_path = sys.argv[1], sys.argv[2]
    meta = {}
    with open(meta_path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            meta[key] = value
    rounds = {}  # (scenario, server) -> one dict per round, in file order
    order = []
    with open(raw_path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            s, server, req, dur, p50, p99, non2xx, errs, redis = fields[:9]
            round_no = fields[9] if len(fields) > 9 else "1"
            trips, inner, served, cpu, redis_cpu = (int(x) for x in redis.split())
            req, dur = int(req), int(dur)
            rounds.setdefault((s, server), []).append(
                {
                    "round": round_no,
                    "rps": req / (dur / 1e6) if dur else 0.0,
                    "req": req,
                    "p50": int(p50),
                    "p99": int(p99),
                    "non2xx": int(non2xx),
                    "errors": int(errs),
                    "trips": trips,
                    "inner": inner,
                    "served": served,
                    "cpu_ticks": cpu,
                    "redis_cpu_us": redis_cpu,
                }
            )
            if s not in order:
                order.append(s)
    n_rounds = max((len(r) for r in rounds.values()), default=1)
    # The median round of each server (the lower middle one for an even count).
    rows = {
        key: sorted(rs, key=lambda r: r["rps"])[(len(rs) - 1) // 2] for key, rs in rounds.items()
    }

    def ratio(s: str, server: str, field: str) -> str:
        """tollgate's value over `server`'s in `field`, one ratio per round, as
        "median" or, with several rounds, "median (min–max)"."""
        mine = {r["round"]: r[field] for r in rounds.get((s, TOLLGATE), [])}
        theirs = {r["round"]: r[field] for r in rounds.get((s, server), [])}
        each = [mine[k] / theirs[k] for k in mine if theirs.get(k)]
        if not each:
            return ""
        text = f"{statistics.median(each):.2f}×"
        if len(each) > 1:
            text += f" ({min(each):.2f}–{max(each):.2f})"
        return text

    out = []
    out.append(f"# tollgate benchmark, {meta.get('date', '?')}")
    out.append("")
    out.append(
        f"Machine: {meta.get('nproc')} CPUs, {meta.get('cpu')}; load average "
        f"{meta.get('load_before')} before, {meta.get('load_after')} after (1/5/15 min)."
    )
    out.append(f"wrk {meta.get('wrk')}; {meta.get('versions')}.")
    if n_rounds > 1:
        out.append(
            f"{n_rounds} rounds, interleaved: each server's row is its median round (by req/s); "
            "each ratio is the median of the rounds' own ratios, with their range."
        )
    out.append("")
    out.append(
        "| scenario | server | req/s | p50 | p99 | non-2xx | errors | tollgate req/s ÷ this | tollgate p99 ÷ this |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in order:
        base = rows.get((s, TOLLGATE))
        for (rs, server), r in rows.items():
            if rs != s:
                continue
            share = f"{100 * r['non2xx'] / r['req']:.1f}%" if r["req"] else "-"
            if base and server != TOLLGATE:
                rps_ratio, p99_ratio = ratio(s, server, "rps"), ratio(s, server, "p99")
            else:
                rps_ratio = p99_ratio = ""
            out.append(
                f"| {SCENARIOS.get(s, s)} | {server} | {r['rps']:,.0f} | {ms(r['p50'])} | "
                f"{ms(r['p99'])} | {share} | {r['errors']} | {rps_ratio} | {p99_ratio} |"
            )
    out.append("")
    out.append("Redis commands per request (INFO commandstats, reset before each measured run):")
    out.append("")
    out.append(
        "| scenario | server | requests decided | round trips (EVALSHA) / request | commands run inside the script / request | tollgate CPU µs / request | Redis CPU µs / request |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|")
    tick_us = 1e6 / int(meta.get("clk_tck", "100") or 100)
    for (s, server), rs in rounds.items():
        r = {k: sum(x[k] for x in rs) for k in ("trips", "inner", "served", "cpu_ticks", "redis_cpu_us")}
        n = r["served"]
        if not server.startswith(TOLLGATE) or not n:
            continue
        out.append(
            f"| {SCENARIOS.get(s, s)} | {server} | {n:,} | {r['trips'] / n:.4f} | "
            f"{r['inner'] / n:.2f} | {r['cpu_ticks'] * tick_us / n:.1f} | "
            f"{r['redis_cpu_us'] / n:.1f} |"
        )
    rss = meta.get("rss", "").split()
    if len(rss) == 5:
        open_conns, fds, idle_kb, rss_kb, hwm_kb = (int(x) for x in rss)
        out.append("")
        out.append(
            f"Memory: a fresh tollgate uses {idle_kb / 1024:.1f} MiB RSS; with {open_conns:,} idle "
            f"keep-alive connections ({fds:,} open descriptors) RSS is {rss_kb / 1024:.1f} MiB and "
            f"the peak (VmHWM) {hwm_kb / 1024:.1f} MiB."
        )
    hwm_load = meta.get("tollgate_hwm_after_load_kb", "")
    if hwm_load.isdigit():
        out.append(f"Peak RSS of the tollgate under the load above: {int(hwm_load) / 1024:.1f} MiB.")
    print("\n".join(out))


if __name__ == "__main__":
    main()
