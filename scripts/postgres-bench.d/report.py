#!/usr/bin/env python3
"""The PostgreSQL section of docs/performance.md, from the runs
scripts/postgres-bench recorded: one JSON line a run, each naming its round,
store, side and scenario beside what the driver printed. The section goes
between its markers, replacing what was there, or at the end of the file
if it has none yet.

    python3 scripts/postgres-bench.d/report.py --runs RUNS.jsonl --out docs/performance.md \\
        --command '...' --date ... --nproc ... --cpu ... --commit ... --versions '...' \\
        --settings '...'
"""

import argparse
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

BEGIN = "<!-- postgres-bench: begin (scripts/postgres-bench writes this section) -->"
END = "<!-- postgres-bench: end -->"

SCENARIOS = [("wide", "10,000 keys, uniform"), ("hot", "one hot key")]
SIDES = {
    "rlf": "rate-limiter-flexible `RateLimiterPostgres` (fixed window)",
    "fixed": "Sluice `PostgresStore`, fixed window",
    "bucket": "Sluice `PostgresStore`, token bucket",
    "naive": "seed 003's naive transaction (token bucket)",
}
# (numerator side, denominator side, scenario, goal)
RATIOS = [
    ("fixed", "rlf", "wide", 2.0),
    ("bucket", "rlf", "wide", None),
    ("bucket", "naive", "wide", None),
    ("fixed", "rlf", "hot", 5.0),
    ("bucket", "rlf", "hot", None),
    ("bucket", "naive", "hot", 5.0),
]


def main():
    p = argparse.ArgumentParser()
    for name in ["runs", "out", "command", "date", "nproc", "cpu", "commit", "versions",
                 "settings", "limits", "load"]:
        p.add_argument("--" + name, required=True)
    a = p.parse_args()
    tick = 1 / os.sysconf("SC_CLK_TCK")

    runs = defaultdict(dict)  # (store, side, scenario) -> round -> result
    for line in Path(a.runs).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            runs[(r["store"], r["side"], r["scenario"])][r["round"]] = r["result"]
    rounds = sorted({rnd for by_round in runs.values() for rnd in by_round})

    def decisions(res):
        return res["allowed"] + res["denied"]

    def rate(res):
        return decisions(res) / res["secs"]

    def cpu_us(res, field):
        n = decisions(res)
        return res[field] * tick / n * 1e6 if n else float("nan")

    def series(key, f):
        return [f(res) for _, res in sorted(runs.get(key, {}).items())]

    def med_rng(xs, fmt):
        if not xs:
            return "", ""
        return fmt(statistics.median(xs)), f"{fmt(min(xs))}–{fmt(max(xs))}"

    def ratios(num, den):
        a_, b_ = runs.get(num, {}), runs.get(den, {})
        return [rate(a_[r]) / rate(b_[r]) for r in rounds if r in a_ and r in b_ and rate(b_[r])]

    count = lambda x: f"{x:,.0f}"
    micros = lambda x: f"{x:,.0f} µs" if x >= 100 else f"{x:.1f} µs"
    two = lambda x: f"{x:.2f}"

    doc = [BEGIN, "", "## The PostgreSQL store", ""]
    doc.append(
        f"Written by `{a.command}` on {a.date}, at commit `{a.commit}`, on {a.nproc} CPUs "
        f"({a.cpu}), load average {a.load} at the start; {a.versions}. Rerun it with the same command; it replaces this section "
        "and nothing else.")
    doc.append("")
    doc.append(
        "Each contender has 32 callers with a call in flight each, on one PostgreSQL the script "
        "starts for the run (`initdb` in a temporary directory), "
        f"{a.settings}. The contenders run in alternating rounds, each round in the reverse order "
        f"of the one before, {len(rounds)} rounds; a median is over rounds, a range over rounds "
        "with the worst included. A ratio is taken within each round, between two runs of that "
        "round, and its median and range are over rounds. Every call that returns within the "
        "measured window counts as a decision, allowed or denied; calls that failed are counted "
        f"apart. {a.limits}")
    doc.append("")
    doc.append(
        "Server CPU is utime + stime of the server's processes (PostgreSQL's postmaster and all "
        "its children, backends and autovacuum's workers included, those that ended in the "
        "window too; redis-server), read from `/proc` as the window opens "
        "and closes, over the decisions made in it. Client CPU is the driver's own process: "
        "Node.js for rate-limiter-flexible, a one-thread Tokio runtime for the rest.")
    doc.append("")
    doc.append("### Decisions per second on PostgreSQL")
    doc.append("")
    doc.append("| keys | contender | decisions/s, median | range | allowed | failed calls | "
               "server CPU a decision | client CPU a decision |")
    doc.append("|---|---|---|---|---|---|---|---|")
    for scen, scen_name in SCENARIOS:
        for side, side_name in SIDES.items():
            key = ("pg", side, scen)
            if key not in runs:
                continue
            m, r = med_rng(series(key, rate), count)
            allowed = series(key, lambda res: res["allowed"] / max(decisions(res), 1))
            failed = sum(series(key, lambda res: res["errors"]))
            srv = med_rng(series(key, lambda res: cpu_us(res, "server_ticks")), micros)
            cli = med_rng(series(key, lambda res: cpu_us(res, "client_ticks")), micros)
            doc.append(f"| {scen_name} | {side_name} | {m} | {r} | "
                       f"{statistics.median(allowed):.0%} | {failed:,} | "
                       f"{srv[0]} ({srv[1]}) | {cli[0]} |")
    doc.append("")
    doc.append("### Ratios and goals")
    doc.append("")
    doc.append("| keys | decisions/s of | ÷ decisions/s of | median of rounds | rounds | goal | met |")
    doc.append("|---|---|---|---|---|---|---|")
    for num, den, scen, goal in RATIOS:
        xs = ratios(("pg", num, scen), ("pg", den, scen))
        if not xs:
            continue
        m, r = med_rng(xs, two)
        met = "" if goal is None else ("yes" if statistics.median(xs) >= goal else "**no**")
        doc.append(f"| {dict(SCENARIOS)[scen]} | {SIDES[num]} | {SIDES[den]} | {m} | {r} | "
                   f"{'' if goal is None else f'≥ {goal:g}'} | {met} |")
    doc.append("")
    doc.append("### Server CPU a decision, PostgreSQL beside Redis")
    doc.append("")
    doc.append(
        "The same driver, limits and keys on Sluice's `RedisStore` (its defaults but the deny "
        "cache, which is off so that every decision reaches Redis, as every decision reaches "
        "PostgreSQL). Redis's runs are not paced: it decides far more a second, so far more of "
        "its calls are denied, and its store batches more of them into one script call. The "
        "ratio is PostgreSQL's CPU over Redis's, within each round.")
    doc.append("")
    doc.append("| keys | algorithm | PostgreSQL, median (rounds) | Redis, median (rounds) | "
               "PostgreSQL ÷ Redis, median (rounds) | Redis decisions/s, median | "
               "allowed, PostgreSQL and Redis |")
    doc.append("|---|---|---|---|---|---|---|")
    for scen, scen_name in SCENARIOS:
        for side, algo in [("fixed", "fixed window"), ("bucket", "token bucket")]:
            pg, rd = ("pg", side, scen), ("redis", side, scen)
            if pg not in runs or rd not in runs:
                continue
            f = lambda res: cpu_us(res, "server_ticks")
            pm, pr = med_rng(series(pg, f), micros)
            rm, rr = med_rng(series(rd, f), micros)
            xs = [f(runs[pg][r]) / f(runs[rd][r]) for r in rounds
                  if r in runs[pg] and r in runs[rd] and f(runs[rd][r]) > 0]
            xm, xr = med_rng(xs, lambda x: f"{x:.1f}")
            rate_m, _ = med_rng(series(rd, rate), count)
            share = lambda key: statistics.median(
                series(key, lambda res: res["allowed"] / max(decisions(res), 1)))
            doc.append(f"| {scen_name} | {algo} | {pm} ({pr}) | {rm} ({rr}) | {xm} ({xr}) | "
                       f"{rate_m} | {share(pg):.0%}, {share(rd):.0%} |")
    errors = sorted({res["first_error"] for by_round in runs.values()
                     for res in by_round.values() if res.get("first_error")})
    if errors:
        doc.append("")
        doc.append("Failed calls said, among others: " + "; ".join(f"`{e}`" for e in errors[:5]) + ".")
    doc += ["", END]
    section = "\n".join(doc) + "\n"

    out = Path(a.out)
    text = out.read_text() if out.exists() else ""
    if BEGIN in text and END in text:
        begin = text.index(BEGIN)
        end = text.index(END) + len(END)
        text = text[:begin] + section.rstrip("\n") + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    out.write_text(text)


if __name__ == "__main__":
    main()
