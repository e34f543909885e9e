#!/usr/bin/env python3
"""Turns run.sh's raw measurements into the results tables (Markdown on stdout).

Usage: report.py RAW META [LATENCY]

raw.tsv columns: scenario, server, requests, duration_us, p50_us, p99_us, non-2xx responses,
socket errors, "<redis round trips> <other Redis commands> <requests tollgate counted>
<CPU clock ticks> <Redis CPU microseconds>", round, "<user ticks> <system ticks>". The CPU
ticks are the server's processes (with their descendants) over the measured run, for every
server; the Redis fields and tollgate's count only for tollgate's servers (0 otherwise). Files
of older runs, where the CPU was tollgate's only and the last column is missing, still read.

latency.tsv columns (optional): round, server, scenario, p50_us, p99_us, req/s, non-2xx,
errors: oha at a fixed rate.

With several rounds (ROUNDS=N), the first table shows each server's median round (by
requests/s) and each ratio as the median of the rounds' own ratios, with their range; the
second table adds the rounds up.
"""

import statistics
import sys

SCENARIOS = {
    "0": "0 plain proxy, no limits (/plain/)",
    "1": "1 allowed (gcra by header, 1,000 users, never trips)",
    "2": "2 denied flood (one user far over its limit)",
    "3": "3 mixed (10% of users over their limits)",
    "4": "4 three limits on one route",
}
PATHS = {"0": "/plain/", "1": "/allowed/"}
TOLLGATE = "tollgate"
# nginx proxy_pass configured to do to a request what tollgate does (bench/run.sh).
SAME_WORK = "nginx-proxy-fwd"
# examples/hyper_floor.rs; in scenario 1 it asks Redis once per request, so its Redis columns count.
FLOOR = "hyper-floor"


def nginx_of(s: str) -> str:
    """The nginx a scenario's ratios are taken against."""
    return "nginx-proxy" if s == "0" else "nginx-limit_req"


def ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def spread(each: list) -> str:
    """"median" or, with several values, "median (min–max)"."""
    if not each:
        return ""
    text = f"{statistics.median(each):.2f}×"
    if len(each) > 1:
        text += f" ({min(each):.2f}–{max(each):.2f})"
    return text


def main() -> None:
    raw_path, meta_path = sys.argv[1], sys.argv[2]
    latency_path = sys.argv[3] if len(sys.argv) > 3 else None
    meta = {}
    with open(meta_path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            meta[key] = value
    tick_us = 1e6 / int(meta.get("clk_tck", "100") or 100)
    rounds = {}  # (scenario, server) -> one dict per round, in file order
    order = []
    with open(raw_path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            s, server, req, dur, p50, p99, non2xx, errs, redis = fields[:9]
            round_no = fields[9] if len(fields) > 9 else "1"
            trips, inner, served, cpu, redis_cpu = (int(x) for x in redis.split())
            user, system = (int(x) for x in fields[10].split()) if len(fields) > 10 else (None, None)
            req, dur = int(req), int(dur)
            # CPU per request: over tollgate's own count where it has one (it includes the
            # requests in flight when wrk stopped), else over wrk's.
            n = served or req
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
                    "n": n,
                    "cpu_ticks": cpu,
                    "user_ticks": user,
                    "sys_ticks": system,
                    "redis_cpu_us": redis_cpu,
                    "cpu_us": cpu * tick_us / n if n else 0.0,
                }
            )
            if s not in order:
                order.append(s)
    n_rounds = max((len(r) for r in rounds.values()), default=1)
    # The median round of each server (the lower middle one for an even count).
    rows = {
        key: sorted(rs, key=lambda r: r["rps"])[(len(rs) - 1) // 2] for key, rs in rounds.items()
    }
    old_format = any(r["user_ticks"] is None for rs in rounds.values() for r in rs)

    def ratio(s: str, server: str, field: str, against: str = "") -> str:
        """`server`'s value over the scenario's nginx's (or `against`'s) in `field`, one ratio
        per round."""
        mine = {r["round"]: r[field] for r in rounds.get((s, server), [])}
        theirs = {r["round"]: r[field] for r in rounds.get((s, against or nginx_of(s)), [])}
        return spread([mine[k] / theirs[k] for k in mine if theirs.get(k)])

    def is_tollgate(server: str) -> bool:
        return server.startswith(TOLLGATE)

    out = []
    out.append(f"# tollgate benchmark, {meta.get('date', '?')}")
    out.append("")
    out.append(
        f"Machine: {meta.get('nproc')} CPUs, {meta.get('cpu')}; load average "
        f"{meta.get('load_before')} before, {meta.get('load_after')} after (1/5/15 min)."
    )
    out.append(f"wrk {meta.get('wrk')}; {meta.get('versions')}.")
    if meta.get("binary"):
        out.append(f"tollgate: {meta['binary']}.")
    if meta.get("floor"):
        out.append(f"hyper-floor: {meta['floor']}.")
    if meta.get("sync"):
        out.append(f"tollgate-sync: every limit `sync: {meta['sync']}`, on a Redis of its own.")
    if n_rounds > 1:
        out.append(
            f"{n_rounds} rounds, interleaved: each server's row is its median round (by req/s); "
            "each ratio is the median of the rounds' own ratios, with their range."
        )
    out.append(
        "CPU: user + system time of the server's processes and their descendants "
        "(/proc/PID/stat) over the measured run, per request; the upstream's is not in it "
        "(except in its own row). Redis: its CPU (INFO cpu) and round trips per request. "
        "Ratios: this server ÷ nginx-proxy (scenario 0) or ÷ nginx-limit_req (1–4)."
    )
    if old_format:
        out.append("(Older raw data: CPU was measured for tollgate only, without the user/system split.)")
    out.append("")
    out.append(
        "| scenario | server | req/s | p50 | p99 | non-2xx | errors | CPU µs / req | user | sys | "
        "Redis CPU µs / req | Redis round trips / req | req/s ÷ nginx | p99 ÷ nginx | CPU ÷ nginx |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in order:
        for (rs, server), r in rows.items():
            if rs != s:
                continue
            share = f"{100 * r['non2xx'] / r['req']:.1f}%" if r["req"] else "-"
            if server != nginx_of(s) and (s, nginx_of(s)) in rounds:
                rps_ratio, p99_ratio = ratio(s, server, "rps"), ratio(s, server, "p99")
                cpu_ratio = ratio(s, server, "cpu_us")
            else:
                rps_ratio = p99_ratio = cpu_ratio = ""
            cpu = f"{r['cpu_us']:.1f}" if r["cpu_ticks"] else "-"
            if r["user_ticks"] is not None and r["n"]:
                user = f"{r['user_ticks'] * tick_us / r['n']:.1f}"
                system = f"{r['sys_ticks'] * tick_us / r['n']:.1f}"
            else:
                user = system = "-"
            if (is_tollgate(server) or server == FLOOR) and r["n"]:
                redis_cpu = f"{r['redis_cpu_us'] / r['n']:.1f}"
                trips = f"{r['trips'] / r['n']:.4f}"
            else:
                redis_cpu = trips = "-"
            out.append(
                f"| {SCENARIOS.get(s, s)} | {server} | {r['rps']:,.0f} | {ms(r['p50'])} | "
                f"{ms(r['p99'])} | {share} | {r['errors']} | {cpu} | {user} | {system} | "
                f"{redis_cpu} | {trips} | {rps_ratio} | {p99_ratio} | {cpu_ratio} |"
            )
    if ("0", SAME_WORK) in rounds and ("0", TOLLGATE) in rounds:
        out.append("")
        out.append(
            f"Scenario 0 against nginx doing the same work ({SAME_WORK}: the client's Host kept "
            f"and the three X-Forwarded headers tollgate adds): tollgate's CPU per request "
            f"{ratio('0', TOLLGATE, 'cpu_us', SAME_WORK)}, req/s "
            f"{ratio('0', TOLLGATE, 'rps', SAME_WORK)}; {SAME_WORK}'s CPU ÷ nginx-proxy's "
            f"{ratio('0', SAME_WORK, 'cpu_us')}."
        )
    out.append("")
    out.append(
        "All rounds added up. Redis commands from INFO commandstats (reset before each measured "
        "run): round trips are the script calls (EVALSHA: decisions; with sync also the sync "
        "and heartbeat scripts) and client-only commands (PING, SCRIPT); the other commands "
        "run inside the scripts; all commands is their sum:"
    )
    out.append("")
    out.append(
        "| scenario | server | requests | CPU µs / request | user | sys | round trips / request | "
        "commands inside the scripts / request | all commands / request | Redis CPU µs / request |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (s, server), rs in rounds.items():
        n = sum(x["n"] for x in rs)
        if not n:
            continue
        cpu = sum(x["cpu_ticks"] for x in rs)
        cells = [f"{cpu * tick_us / n:.1f}" if cpu else "-"]
        if all(x["user_ticks"] is not None for x in rs):
            cells.append(f"{sum(x['user_ticks'] for x in rs) * tick_us / n:.1f}")
            cells.append(f"{sum(x['sys_ticks'] for x in rs) * tick_us / n:.1f}")
        else:
            cells += ["-", "-"]
        if is_tollgate(server):
            trips = sum(x["trips"] for x in rs)
            inner = sum(x["inner"] for x in rs)
            redis_cpu = sum(x["redis_cpu_us"] for x in rs)
            cells += [
                f"{trips / n:.4f}",
                f"{inner / n:.2f}",
                f"{(trips + inner) / n:.4f}",
                f"{redis_cpu / n:.1f}",
            ]
        else:
            cells += ["-"] * 4
        out.append(f"| {SCENARIOS.get(s, s)} | {server} | {n:,} | " + " | ".join(cells) + " |")

    if latency_path:
        out += latency_report(latency_path, meta)

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
        if len(rss) != 5:
            out.append("")
        out.append(f"Peak RSS of the tollgate under the load above: {int(hwm_load) / 1024:.1f} MiB.")
    print("\n".join(out))


def latency_report(path: str, meta: dict) -> list:
    """The fixed-rate table: each target's p50 and p99, and what it adds over going to the
    upstream directly, as medians over the rounds (the added values per round first)."""
    runs = {}  # (round, server, scenario) -> dict
    with open(path) as f:
        for line in f:
            rnd, server, s, p50, p99, rps, non2xx, errors = line.rstrip("\n").split("\t")
            runs[(rnd, server, s)] = {
                "p50": int(p50),
                "p99": int(p99),
                "rps": float(rps),
                "non2xx": int(non2xx),
                "errors": int(errors),
            }
    if not runs:
        return []
    direct = {rnd: r for (rnd, server, _), r in runs.items() if server == "upstream"}

    def added(rnd: str, r: dict, field: str):
        return r[field] - direct[rnd][field] if rnd in direct else None

    targets = []
    for _, server, s in runs:
        if (server, s) not in targets:
            targets.append((server, s))
    out = ["", f"Fixed-rate latency: {meta.get('latency', 'oha')}; added = this − the upstream directly.", ""]
    out.append(
        "| path | server | req/s | p50 | p99 | added p50 | added p99 | non-2xx | errors |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}  # (server, s) -> {"p50": [...], "p99": [...]} added values per round
    for server, s in targets:
        mine = [(rnd, r) for (rnd, sv, sc), r in runs.items() if (sv, sc) == (server, s)]
        med = lambda field: statistics.median(r[field] for _, r in mine)  # noqa: E731
        adds = {
            field: [a for a in (added(rnd, r, field) for rnd, r in mine) if a is not None]
            for field in ("p50", "p99")
        }
        summary[(server, s)] = adds
        cells = []
        for field in ("p50", "p99"):
            if server == "upstream" or not adds[field]:
                cells.append("")
            else:
                cells.append(f"{statistics.median(adds[field]) / 1000:+.3f} ms")
        out.append(
            f"| {PATHS.get(s, s)} | {server} | {med('rps'):,.0f} | {ms(med('p50'))} | "
            f"{ms(med('p99'))} | {cells[0]} | {cells[1]} | {sum(r['non2xx'] for _, r in mine)} | "
            f"{sum(r['errors'] for _, r in mine)} |"
        )
    lines = []
    for server, s in targets:
        if not server.startswith(TOLLGATE):
            continue
        nginx = "nginx-proxy" if s == "0" else "nginx-limit_req"
        if (nginx, s) not in summary:
            continue
        for field in ("p50", "p99"):
            mine, theirs = summary[(server, s)][field], summary[(nginx, s)][field]
            each = [a / b for a, b in zip(mine, theirs) if b > 0]
            if each and len(each) == len(mine) == len(theirs):
                text = spread(each)
            elif mine and theirs and statistics.median(theirs) > 0:
                text = (
                    f"{statistics.median(mine) / statistics.median(theirs):.2f}× (ratio of the "
                    f"medians: {nginx} added ≤ 0 in some round)"
                )
            else:
                text = f"n/a ({nginx} added ≤ 0)"
            lines.append(f"- {PATHS.get(s, s)}: {server}'s added {field} ÷ {nginx}'s: {text}")
            if s == "0" and (SAME_WORK, s) in summary:
                same = summary[(SAME_WORK, s)][field]
                each = [a / b for a, b in zip(mine, same) if b > 0]
                if each and len(each) == len(mine) == len(same):
                    lines.append(
                        f"- {PATHS.get(s, s)}: {server}'s added {field} ÷ {SAME_WORK}'s: {spread(each)}"
                    )
    if lines:
        out.append("")
        out += lines
    return out


if __name__ == "__main__":
    main()
