#!/usr/bin/env python3
"""Turns the outputs that scripts/bench-report collected into
docs/performance.md and the README's performance summary. Run by
scripts/bench-report; not meant to be run alone."""

import argparse
import re
import statistics
import textwrap
from pathlib import Path

SHAPES = [
    ("", "shuffled", "keys first decided in an order unrelated to the visiting order; two threads half a lap apart"),
    ("inserted:", "inserted", "keys visited in the order they were first decided, so that governor's copies of them lie in memory in visiting order"),
    ("near:", "near", "two threads walking the same keys four apart, meeting on the same lock stripes and cache lines"),
    ("zipf:", "zipf", "4M visits drawn from a Zipf distribution (s = 1.1) over 1M keys"),
]

ROW = re.compile(r"^(\S+)\s+([\d.]+) ns\s+([\d.]+) ns\s+([\d.]+)\s+([\d.]+)–([\d.]+)\s*$")
SPREAD_ROW = re.compile(r"^(\S+)\s+([\d.]+) ([\d.]+)–([\d.]+)\s+(\d+) of (\d+)\s")
REDIS_ROW = re.compile(r"^(mixed|abuse)\s+(naive|sluice|window|log)\s+(\d+)\s")


def rng(values, fmt="{:.2f}"):
    lo, hi = min(values), max(values)
    if fmt.format(lo) == fmt.format(hi):
        return fmt.format(lo)
    return f"{fmt.format(lo)}–{fmt.format(hi)}"


def parse_paired(work, runs):
    """{case: [(sluice_ns, other_ns, ratio, lo, hi) per run]} for each table."""
    governor, sliding = {}, {}
    for r in range(1, runs + 1):
        for line in (work / f"paired.{r}.txt").read_text().splitlines():
            m = ROW.match(line)
            if not m:
                continue
            name = m.group(1)
            row = tuple(float(m.group(i)) for i in range(2, 7))
            beside_bucket = name.startswith(("sliding_", "calendar_"))
            (sliding if beside_bucket else governor).setdefault(name, []).append(row)
    return governor, sliding


def split_case(name):
    for prefix, shape, _ in reversed(SHAPES):
        if prefix and name.startswith(prefix):
            return shape, name[len(prefix):]
    return "shuffled", name


def join_case(shape, case):
    """The paired benchmark's name of `case` in `shape`: `split_case` undone."""
    return next(prefix for prefix, s, _ in SHAPES if s == shape) + case


def parse_keyed_instructions(work):
    """[(case, sluice, governor)] from `scripts/keyed-instructions`, or
    nothing when it was not run."""
    path = work / "keyed-instructions.txt"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        # The case, then each side's median, each perhaps followed by its
        # runs' counts in parentheses.
        parts = line.split()
        medians = [int(p) for p in parts[1:] if p.isdigit()]
        if len(medians) == 2:
            rows.append((parts[0], *medians))
    return rows


def parse_keyed_spread(work):
    """[(case, median, lo, hi, below, processes)] from `scripts/keyed-spread`,
    or nothing when it was not run."""
    path = work / "keyed-spread.txt"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        m = SPREAD_ROW.match(line)
        if m:
            rows.append((m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4)),
                         int(m.group(5)), int(m.group(6))))
    return rows


def parse_redis(work):
    """Per scenario, per side, the decisions/s of each round, in order."""
    text = (work / "redis.txt").read_text()
    text = text.split("medians of")[0]
    rounds = {}
    for line in text.splitlines():
        m = REDIS_ROW.match(line)
        if m:
            rounds.setdefault(m.group(1), {}).setdefault(m.group(2), []).append(float(m.group(3)))
    return rounds


def parse_serving(work):
    out = {}
    for line in (work / "serving.txt").read_text().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def rounds_range(s):
    """'0.71–0.83' as two floats."""
    if not s or "–" not in s:
        return None
    lo, hi = s.split("–")
    return float(lo), float(hi)


def main():
    ap = argparse.ArgumentParser()
    for a in ["work", "out", "readme", "date", "commit", "nproc", "cpu", "mem-gib", "load"]:
        ap.add_argument("--" + a, required=True)
    for a in ["rounds", "paired-runs", "build-seconds", "seconds"]:
        ap.add_argument("--" + a, type=int, required=True)
    args = ap.parse_args()
    work = Path(args.work)

    governor, sliding = parse_paired(work, args.paired_runs)
    redis = parse_redis(work)
    serving = parse_serving(work)

    goals = []  # (goal, measured, met, why-key)
    # The why-keys of goals met by the median while some rounds miss them.
    narrow = set()

    # --- keyed decisions -------------------------------------------------
    by_shape = {}
    for name, runs in governor.items():
        shape, case = split_case(name)
        by_shape.setdefault(shape, []).append((case, runs))
    keyed_lines = []
    worst = {}  # shape -> list of (case, worst run median)
    lowest_round = {}  # (shape, case) -> the lowest round's ratio over all runs
    for prefix, shape, what in SHAPES:
        rows = by_shape.get(shape, [])
        if not rows:
            continue
        keyed_lines.append(f"\n**{shape}**: {what}.\n")
        keyed_lines.append("| case | sluice | governor | governor ÷ sluice, median of each run | rounds, over all runs |")
        keyed_lines.append("|---|---|---|---|---|")
        for case, runs in rows:
            medians = [r[2] for r in runs]
            keyed_lines.append(
                f"| {case} | {rng([r[0] for r in runs], '{:.0f}')} ns | {rng([r[1] for r in runs], '{:.0f}')} ns "
                f"| {rng(medians)} | {min(r[3] for r in runs):.2f}–{max(r[4] for r in runs):.2f} |"
            )
            worst.setdefault(shape, []).append((case, min(medians)))
            lowest_round[(shape, case)] = min(r[3] for r in runs)
    every = [(s, c, w) for s, cases in worst.items() for c, w in cases]

    def at_least(goal, why, cases, floor, context=lambda shape, case: ""):
        """The goal that every case's worst run median is `floor` or more;
        `context` adds a note on the case with the lowest one."""
        if not cases:
            return
        low = min(cases, key=lambda x: x[2])
        below = [f"{s} {c} ({w:.2f})" for s, c, w in cases if w < floor]
        notes = [(f"below {floor}: " + ", ".join(below)) if below else "", context(low[0], low[1])]
        goals.append((goal, f"lowest run median {low[2]:.2f} ({low[0]} {low[1]})", not below, why,
                      "; ".join(n for n in notes if n)))
        if not below and any(lowest_round[(s, c)] < floor for s, c, _ in cases):
            narrow.add(why)

    spread = parse_keyed_spread(work)

    def alone(shape, case):
        """How often a single process lands below 1.0 where the two sides
        are closest: from the case with the lowest median when it was
        among them."""
        if not spread:
            return ""
        name = join_case(shape, case)
        own = [r for r in spread if r[0] == name]
        if own:
            return f"{name} alone: {own[0][4]} of {own[0][5]} fresh processes below 1.0"
        below, processes = sum(r[4] for r in spread), sum(r[5] for r in spread)
        return f"the closest cases alone: {below} of {processes} fresh processes below 1.0"

    at_least("keyed decisions: at least governor's speed in every shape", "keyed-every", every, 1.0,
             alone)
    at_least("keyed decisions at 1M keys, shuffled and Zipf: at least 1.5× governor's speed", "keyed-1m",
             [(s, c, w) for s, c, w in every if s in ("shuffled", "zipf") and "/1Mkeys/" in c], 1.5)

    sliding_lines = [
        "| case | token bucket | other | other ÷ bucket, median of each run | rounds, over all runs |",
        "|---|---|---|---|---|",
    ]
    for name, runs in sliding.items():
        sliding_lines.append(
            f"| {name} | {rng([r[0] for r in runs], '{:.0f}')} ns | {rng([r[1] for r in runs], '{:.0f}')} ns "
            f"| {rng([r[2] for r in runs])} | {min(r[3] for r in runs):.2f}–{max(r[4] for r in runs):.2f} |"
        )

    # --- Redis -----------------------------------------------------------
    redis_lines = [
        "| scenario | side | decisions/s, median | ÷ naive, median of rounds | rounds |",
        "|---|---|---|---|---|",
    ]
    redis_summary = {}
    for scenario, sides in redis.items():
        naive = sides.get("naive", [])
        for side in ["naive", "sluice", "window", "log"]:
            values = sides.get(side, [])
            if not values:
                continue
            if side == "naive":
                redis_lines.append(f"| {scenario} | naive | {statistics.median(values):,.0f} | | |")
                continue
            ratios = [v / n for v, n in zip(values, naive) if n > 0]
            med = statistics.median(ratios)
            redis_summary[(scenario, side)] = (med, min(ratios), max(ratios))
            name = {"sluice": "token bucket", "window": "sliding window", "log": "sliding log"}[side]
            redis_lines.append(
                f"| {scenario} | {name} | {statistics.median(values):,.0f} | {med:.2f} | {min(ratios):.2f}–{max(ratios):.2f} |"
            )

    # --- serving ---------------------------------------------------------
    def num(key):
        try:
            return float(serving.get(key, ""))
        except ValueError:
            return None

    serving_lines = [
        "| comparison | median of rounds | rounds | per call |",
        "|---|---|---|---|",
    ]
    serve_eff, serve_r = num("serve_eff"), rounds_range(serving.get("serve_rounds"))
    if serve_eff is not None:
        serving_lines.append(
            f"| `sluice serve` ÷ bare hyper server, `POST /v1/limit` per server CPU-second | {serve_eff:.2f} | "
            f"{serve_r[0]:.2f}–{serve_r[1]:.2f} | |"
        )
        goals.append(("`sluice serve`: at least 0.80 of a bare hyper server's requests per server CPU-second",
                      f"{serve_eff:.2f} (rounds {serve_r[0]:.2f}–{serve_r[1]:.2f})", serve_eff >= 0.8, "serve", ""))
    for key, label in [("rls", "most calls denied"), ("rls_allowed", "every call allowed")]:
        ratio = num(f"{key}_ratio")
        if ratio is None:
            continue
        r = rounds_range(serving.get(f"{key}_rounds"))
        us, floor = serving.get(f"{key}_us"), serving.get(f"{key}_floor_us")
        serving_lines.append(
            f"| Envoy RLS ÷ bare tonic server, calls per server CPU-second, {label} | {ratio:.2f} | "
            f"{r[0]:.2f}–{r[1]:.2f} | {us} µs against {floor} µs |"
        )
        goals.append((f"Envoy RLS, {label}: at least 0.80 of a bare tonic server's calls per server CPU-second",
                      f"{ratio:.2f} (rounds {r[0]:.2f}–{r[1]:.2f}); {us} µs a call against {floor}",
                      ratio >= 0.8, "rls", ""))
        if ratio >= 0.8 > r[0]:
            narrow.add("rls")
    def against_nginx(key, subject):
        """A row of CPU per proxied request against nginx's; its ratio,
        rounds and figures, or None when it was not measured."""
        ratio = num(f"{key}_cpu_ratio")
        if ratio is None:
            return None
        r = rounds_range(serving.get(f"{key}_cpu_rounds"))
        us, nus = serving.get(f"{key}_us"), serving.get(f"{key}_nginx_us")
        serving_lines.append(
            f"| {subject} ÷ nginx `proxy_pass`, CPU per request | {ratio:.2f} | "
            f"{r[0]:.2f}–{r[1]:.2f} | {us} µs against {nus} µs |"
        )
        return ratio, r, us, nus

    with_rule = against_nginx("proxy", "`sluice proxy` (one per-IP rule)")
    proxy = with_rule[0] if with_rule else None
    if with_rule:
        _, r, pus, nus = with_rule
        goals.append(("`sluice proxy`: at most 1.3× the CPU nginx spends on a proxied request",
                      f"{proxy:.2f} (rounds {r[0]:.2f}–{r[1]:.2f}); {pus} µs against {nus}",
                      proxy <= 1.3, "proxy", ""))
        if proxy <= 1.3 < r[1]:
            narrow.add("proxy")
    no_rule = against_nginx("bare", "`sluice proxy` with no rule")
    bare = no_rule[0] if no_rule else None
    nginx_headers = against_nginx("headers", "nginx adding the rule's seven RateLimit headers")

    # --- the document ----------------------------------------------------
    minutes = f"{args.seconds // 60} min {args.seconds % 60} s"
    doc = [f"""# Performance

Written by `scripts/bench-report` on {args.date}, at commit
`{args.commit}`, on this machine: {args.nproc} CPUs ({args.cpu}), {args.mem_gib} GiB,
load average {args.load} at the start. The run took {minutes}, of which
{args.build_seconds} s building. Rerun it with `scripts/bench-report`; the
README quotes this file and nothing else.

Every comparison runs both sides in one process or one script, in
alternating rounds, and reports ratios: the machine's speed drifts, so
figures from different runs are not compared. A median is over rounds;
a range is over runs, or over rounds where it says so, and always includes
the worst.

## Goals

| goal | measured | met |
|---|---|---|"""]
    for goal, measured, met, _, note in goals:
        doc.append(f"| {goal} | {measured}{'; ' + note if note else ''} | {'yes' if met else '**no**'} |")
    doc.append(f"""
## Keyed decisions in process, against governor

`cargo bench -p sluice-core --bench paired`, run {args.paired_runs} times. It
times keyed decisions of the in-memory store next to governor's keyed
limiter (keys `user:%08d`), on 1 and 2 threads. A call is *allowed* with
buckets full again by the next call, *allowed_held* with every key held
short of full, or *denied*. The sides alternate in 25 ms slices of the
same number of decisions for 15 rounds, each round in the order A B B A,
and each round's ratio compares the two sides' slices of that round. So
each side runs once straight after itself and once straight after the
other in every round. Until commit `d7ec472` a round was one slice of
each, the first side alternating. In the inserted shape at 100k keys on
two threads, every key allowed, governor's slices took about 43 ns a
decision straight after its own and 53 to 60 ns straight after Sluice's,
while Sluice's took about 51 ns either way: every other round then
favoured governor, and a median of 15 such rounds falls in one half or
the other. The ratio is governor's time over Sluice's: above 1, Sluice
is faster. Each call's key is read from copies laid out in the order the
walk visits them, as a key a server has just
built from a request is in cache, so that only the limiters' own memory
is visited at random. Until commit `6b150a4` the Zipf walk read its keys
where they were first made and missed the cache on the key string itself
on both sides: at `83dedc6` its run medians were 1.19 to 1.83, the
cases with every key held 1.40 to 1.44.
""")
    doc.extend(keyed_lines)
    instructions = parse_keyed_instructions(work)
    if instructions:
        doc.append("""
**Instructions per decision** (`scripts/keyed-instructions`, the median of
three runs): each side alone under callgrind, on one thread, the
instructions of the timed loop divided by the decisions it made. The loop's own work, reading the next
key and keeping the result, is in both counts alike, and SipHash of the
key is a large share of each. Counts drift far less than times with the
machine's load, so they say how much of a ratio is work and how much is
memory.

| case | sluice | governor |
|---|---|---|""")
        doc.extend(f"| {case} | {ours:,} | {theirs:,} |" for case, ours, theirs in instructions)
    if spread:
        doc.append(f"""
**The closest cases, one process at a time** (`scripts/keyed-spread`):
each case alone in {spread[0][5]} fresh processes of the same benchmark, with
the same rounds and slices as a run above, and each process's median
ratio. A run above decides every case in turn in one process.

| case | median over processes | range | processes below 1.0 |
|---|---|---|---|""")
        doc.extend(f"| {case} | {med:.2f} | {lo:.2f}–{hi:.2f} | {below} of {n} |"
                   for case, med, lo, hi, below, n in spread)
    doc.append(f"""
## The sliding algorithms and calendar windows in process

The same benchmark times the token bucket against the sliding window, the
sliding log and a calendar window (a day in Europe/Berlin), each in a
memory store of its own, on one thread. The ratio is the other
algorithm's time over the bucket's: above 1, the other one is slower.

""")
    doc.extend(sliding_lines)
    doc.append(f"""
## The Redis store

`cargo bench -p sluice-redis --bench store`, {args.rounds} rounds of 2 s.
It runs the Redis store next to a naive token bucket that makes one script
call per decision, on the same `redis-server`, with 64 callers. *mixed* is
10,000 keys, nearly every call allowed; *abuse* sends 90% of calls to 100
keys over their limit. Each round's ratio compares two runs next to each
other.

""")
    doc.extend(redis_lines)
    doc.append(f"""
## Serving

`scripts/bench-serving` (`LAYOUTS=0`), {args.rounds} rounds of 2 s a side,
sides alternating. The servers are pinned to one CPU and the load client
(`sluice bench`) to the other. Each figure is requests per server
CPU-second, which does not depend on who set the pace; per call, the
server CPU a call took. Each round's ratio compares two runs next to each
other, and a comparison's ratio is the median of its rounds'. The figures
per call are each side's median, so their quotient can differ from that
ratio, and two comparisons made minutes apart can differ by more than
what separates their subjects.

- `sluice serve` answers `POST /v1/limit` (10,000 keys of `sendMessage`,
  most denied once their burst is spent) beside `sluice bench baseline`, a
  hyper server that answers a fixed decision.
- Its Envoy RLS answers `ShouldRateLimit` beside `sluice bench
  rls-baseline`, a tonic server built as serve's that answers OK without
  deciding. It runs twice: on 10,000 keys, where most calls are denied,
  and with a new key each call, where every call is allowed.
- `sluice proxy` with one per-IP rule that admits everything, and nginx's
  `proxy_pass` (one worker, kept-alive upstream connections), both in
  front of the bare hyper server on the same CPU. Only the proxy's
  process, or nginx's worker, is counted. Then the same proxy with no
  rule at all, against nginx again: what the HTTP stack costs before any
  rate limiting.

RLS answers of calls that are in flight together leave in one write. h2
writes a DATA payload of 256 bytes or more on its own when the socket
takes vectored writes, and must send it before it may queue the next
frame. A denial's answer, with its headers and problem body, is that
large, so each one cost a write of its own and its trailers another:
about two `sendto` a call against the floor's one (`perf stat -e
'syscalls:sys_enter_sendto'` on both servers). The gRPC listener now
tells h2 that its sockets take no vectored writes, so h2 copies payloads
under 1 KiB into its buffer. `scripts/bench-report` at commit `7d83888`,
before that change, measured the denial row at 0.64; the write alone is
most of the difference, and the rest came from building Envoy's header
list without an `http` header map and from a cheaper top-keys summary.
""")
    doc.extend(serving_lines)
    # The figures the explanations quote, as they print.
    why_figures = {"bare_paragraph": "", "one_key_paragraph": ""}
    one_key = next(((o, t) for c, o, t in instructions if c == "allowed/1keys/1threads"), None)
    work_line = (f"{one_key[0]} instructions a decision against {one_key[1]} with every key allowed "
                 "(the instruction table above)" if one_key else "about the same instructions a decision")
    one_keys = [r for r in spread if r[0].endswith("/1keys/1threads")]
    if one_keys:
        below, processes = sum(r[4] for r in one_keys), sum(r[5] for r in one_keys)
        each = ", ".join(f"{m:.2f} ({c.split('/')[0]})" for c, m, _, _, _, _ in one_keys)
        lo, hi = min(r[2] for r in one_keys), max(r[3] for r in one_keys)
        cases = "this case" if len(one_keys) == 1 else f"each of these {len(one_keys)} cases"
        medians = args.paired_runs * len(one_keys)
        spread_line = (f"In this run `scripts/keyed-spread` ran {cases} alone in {one_keys[0][5]} fresh "
                       f"processes: the median process's ratio was {each}, and the processes ranged "
                       f"from {lo:.2f} to {hi:.2f}, {below} of the {processes} below 1.0. A report "
                       f"takes the lowest of {medians} such medians ({len(one_keys)} in each of "
                       f"{args.paired_runs} runs), so "
                       + ("now and then one of them lands below 1.0 and the goal reads as missed."
                          if below else "a run can land below 1.0 even though none of these processes did."))
    else:
        spread_line = ("Sluice's side is ahead by a few hundredths to a tenth, and the margin moves with "
                       "the machine, so a run can land below 1.0.")
    inserted = next((r for r in spread if r[0] == "inserted:allowed/100kkeys/2threads"), None)
    why_figures["inserted_spread"] = "" if inserted is None else "\n" + textwrap.fill(
        "In this run `scripts/keyed-spread` ran that case (`inserted:allowed/100kkeys/2threads`) "
        f"alone in {inserted[5]} fresh processes: "
        f"their medians ranged from {inserted[2]:.2f} to {inserted[3]:.2f}, with {inserted[1]:.2f} "
        f"in the middle, and {inserted[4]} of the {inserted[5]} fell below 1.0.",
        72, break_on_hyphens=False) + "\n"
    why_figures["one_key_paragraph"] = textwrap.fill(
        "In the uncontended 1-key cases the two sides do the same work: SipHash of the key, one "
        "read of the clock and, for an admitted call, one compare-and-swap; "
        f"{work_line}. {spread_line}", 72, break_on_hyphens=False) + "\n"
    if bare is not None:
        against = "within the goal" if bare <= 1.3 else "over the goal"
        try:
            rule_us = float(serving.get("proxy_us", "")) - float(serving.get("bare_us", ""))
        except ValueError:
            rule_us = 0.0
        rule = (f"The per-IP rule adds about {rule_us:.1f} µs a request (the row above it, less this "
                "one, from two comparisons of the same run)" if rule_us > 0 else
                "What the per-IP rule adds is within the noise of this run")
        why_figures["bare_paragraph"] = f"""One serving row is the proxy with no rule at all: {bare:.2f}×
nginx's CPU a request, {serving.get("bare_us")} µs against {serving.get("bare_nginx_us")} µs. That is
hyper's HTTP/1 on both sides and tokio's scheduling, before any rate
limiting, and it is {against} by itself. {rule}: the key, the
decision, and the RateLimit headers on every response."""
        if nginx_headers is not None:
            h, (hlo, hhi), hus, hnus = nginx_headers
            cost = ("and its rounds fall on both sides of 1: the headers' bytes are not what the rule costs"
                    if hlo <= 1.0 <= hhi else
                    "so the headers' bytes alone cost that much to a proxy that computes nothing")
            why_figures["bare_paragraph"] += f""" nginx made to add the same seven
headers, values of the same lengths, spends {h:.2f}× its own CPU a request
({hus} µs against {hnus} µs, the last serving row), {cost}."""
        why_figures["bare_paragraph"] = textwrap.fill(why_figures["bare_paragraph"], 72) + "\n"
    def explain(heading, intro, listed):
        """A section with the explanation of each goal in `listed`, once each."""
        keys = list(dict.fromkeys(g[3] for g in listed if g[3] in WHY))
        if keys:
            doc.append(heading)
            doc.extend(intro)
            doc.extend(WHY[k].format_map(why_figures) for k in keys)

    missed = [g for g in goals if not g[2]]
    explain("\n## Where a goal is missed, and why\n", [], missed)
    missed_keys = {g[3] for g in missed}
    explain("\n## Met by the median, missed by some rounds\n",
            [textwrap.fill(
                "These goals hold in this run's median, but some of its rounds fall on the other "
                "side of the goal, and other runs of the same code have landed there: what the "
                "margin is made of follows.", 72) + "\n"],
            [g for g in goals if g[2] and g[3] in narrow and g[3] not in missed_keys])
    doc.append(METHODS)
    # Sections end with a newline and are joined with another: one blank
    # line between them, never two.
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(doc))
    # scripts/postgres-bench and scripts/shaping-flood write sections of
    # their own between markers: they are carried over as they stand, at
    # the end.
    old = Path(args.out).read_text() if Path(args.out).exists() else ""
    for script in ("postgres-bench", "shaping-flood"):
        begin, end = f"<!-- {script}: begin", f"<!-- {script}: end -->"
        if begin in old and end in old:
            kept = old[old.index(begin):old.index(end) + len(end)]
            text = text.rstrip() + "\n\n" + kept
    Path(args.out).write_text(text.rstrip() + "\n")

    # --- the README's summary -------------------------------------------
    lines = []
    for prefix, shape, _ in SHAPES:
        if shape in worst:
            cases = worst[shape]
            lines.append(f"{shape} {rng([w for _, w in cases])}×")
    readme_block = ["<!-- bench-report: begin (scripts/bench-report writes this list) -->",
                    f"Measured by `scripts/bench-report` on {args.date} on a {args.nproc}-CPU machine;",
                    "medians, the range over cases and runs, worst run included:", ""]
    if lines:
        readme_block.append("- keyed decisions in process, governor's time ÷ Sluice's, by traffic shape: " + "; ".join(lines) + ";")
    m, s_ = redis_summary.get(("mixed", "sluice")), redis_summary.get(("abuse", "sluice"))
    if m and s_:
        readme_block.append(
            f"- the Redis store: {m[1]:.2f}–{m[2]:.2f}× a one-script-call-per-decision token bucket on mixed "
            f"traffic, {s_[1]:.2f}–{s_[2]:.2f}× under abuse (rounds);")
    if serve_eff is not None:
        readme_block.append(
            f"- `sluice serve`: {serve_r[0]:.2f}–{serve_r[1]:.2f} of a bare hyper server's requests per server CPU-second (rounds);")
    ratio = num("rls_ratio")
    if ratio is not None:
        r1, r2 = rounds_range(serving.get("rls_rounds")), rounds_range(serving.get("rls_allowed_rounds"))
        readme_block.append(
            f"- Envoy RLS: {r1[0]:.2f}–{r1[1]:.2f} of a bare tonic server's calls per server CPU-second with most "
            f"calls denied, {r2[0]:.2f}–{r2[1]:.2f} with every call allowed (rounds);")
    if proxy is not None:
        r = rounds_range(serving.get("proxy_cpu_rounds"))
        bare_note = ""
        if bare is not None:
            rb = rounds_range(serving.get("bare_cpu_rounds"))
            bare_note = f"; with no rule, {rb[0]:.2f}–{rb[1]:.2f}×"
        readme_block.append(
            f"- `sluice proxy`: {r[0]:.2f}–{r[1]:.2f}× the CPU nginx spends on a proxied request{bare_note} (rounds).")
    readme_block.append("<!-- bench-report: end -->")
    readme = Path(args.readme).read_text()
    begin = readme.index("<!-- bench-report: begin")
    end = readme.index("<!-- bench-report: end -->") + len("<!-- bench-report: end -->")
    Path(args.readme).write_text(readme[:begin] + "\n".join(readme_block) + readme[end:])


WHY = {
    "serve": """### `sluice serve` against a bare hyper server

Under callgrind a `POST /v1/limit` call is about 20,100 instructions in
serve and 11,800 in the bare server: reading the JSON call, the decision,
and writing the answer and its headers. Both pay the same system calls
and TCP work, which is why the ratio per CPU-second sits near 0.8 rather
than near 0.6. Its rounds swing widely on this virtual machine, and the
median of a run has landed on either side of the goal: four runs on
2026-11-26, before and after the floors set `TCP_NODELAY`, gave 0.76 to
0.86.
""",
    "keyed-every": """### Keyed decisions where the two sides are close

Two kinds of case sit near 1.0. In the *inserted* shape at 100k keys,
governor's keys are visited in the order it copied them into memory, the
hardware prefetches those copies, and governor is left with one cache
miss a decision, its table's bucket, as Sluice has one, its table's slot
(`perf record` of `SLUICE_PAIRED_ONLY=inserted:allowed_held/100kkeys/1threads`
puts about three quarters of each side's main function on that one
load). In the
uncontended 1-key cases neither side misses at all. In both, what
separates the two is the work around the miss, which the instruction
table above counts: about the same for one key, where Sluice's lock-free
slot answers, and more for Sluice where a key is decided under its
stripe's lock, which also builds the full answer (remaining, reset, retry
time) that governor's yes or no does not carry. At 1M keys governor's
second miss, its copy of the key, comes back and Sluice stays ahead.

The uncontended 1-key cases fell below 1.0 between commit `2724aa6`
(2026-11-27) and commit `c6ce31a`, which brought the fat-key bounds, the
PostgreSQL store's states and calendar windows. Each case alone
(`SLUICE_PAIRED_ONLY=CASE`) in fresh processes of the paired benchmark
built at each commit, the commits taking turns, six processes each,
process medians: every key allowed 0.94–0.98 at `2724aa6`, 0.81–0.86 at
`c6ce31a` and 0.76–0.84 at `e65ea3d`; denied 0.98–1.05, 0.84–0.91 and
0.80–0.86. Instructions a decision (`scripts/keyed-instructions`) went
from 409 to 453 to 438 with every key allowed, where governor's stayed
near 400; the times fell further than the counts, which is not explained
yet. `Pending::decision`, the answer built after the compare-and-swap,
had stopped being inlined once calendar windows grew its fixed-window
half; inlining it again took 18 instructions off but no time measurably.

Commit `45bedd2` cut that work (`scripts/keyed-instructions`, against
commit `2867e69`): a held decision from 929 instructions to 575, a denied
one from 711 to 575 and a 1-key one from 469 to 409, with the bucket's
arithmetic and the table's common paths inline, and no library call for a
whole-number check. Commit
`85ff228` went from 64 lock stripes to 512 on this machine, after the
two-thread cases showed the stripes' locks and table headers passing
between the cores. Before them, at `da627ee`, the inserted cases at 100k
keys with every key held or denied measured 0.73 to 1.15, and two of the
uncontended 1-key cases 0.98 and 0.99.

The *inserted* cases at 100k keys are the closest, and a run's median
has landed on either side of 1.0. The report's run at commit `4aa91d6`
missed the goal in its second run: every key allowed on two threads
0.91, every key held 0.96 on one thread and 0.99 on two; the run at
`6318784` met it, with these cases at 1.11 to 1.36. On one thread,
governor's time for these cases moves more from one run to the next
than Sluice's does. In those two runs, with every key held, Sluice took
92 and 78 ns a decision and governor 131 and 81 ns (run medians of the
rounds' ratios 1.29 and 0.96). Why is unknown: this machine gives no
access to the CPU's cache counters.

On two threads, a second thread has helped governor more than it helped
Sluice. `SLUICE_PAIRED_ONLY=inserted: cargo bench -p sluice-core --bench
paired` at commit `1c43f4c`, every key allowed at 100k keys:

- one thread: Sluice 77 ns a decision, governor 123 ns;
- two threads: 57 ns against 58 ns, which is 113 ns against 116 ns for
  each thread's decision.

`perf record` of Sluice's side alone (`SLUICE_PAIRED_SOLO=sluice
SLUICE_PAIRED_ONLY=inserted:allowed/100kkeys/2threads`, then `perf
annotate` of `single_locked`) showed where its thread lost time. On two
threads, about 24% of `single_locked`'s samples waited on the first load
of the stripe's lock; on one thread, 0.6%. Both threads decide keys all
over the table, so a stripe's lock line was last written by the other
core about half the time, and it has to come across. Two things tried at
`4a9eaf3` did not move the two-thread ratios beyond the rounds' spread:
a spin lock that releases with a plain store instead of `parking_lot`'s
compare-and-swap, and four times as many stripes.

Commit `4aa91d6` puts everything a decision writes in a stripe on the
lock's cache line: the ring of recently denied keys, the stripe's count
and the first table's counts. Before, a decision wrote two of its
stripe's lines, and each had been written last by the other core about
half the time. The paired benchmark's binary, built at `261c6b9` and at
`4aa91d6`, was run by turns, three runs each of 15 rounds, on one
*inserted* case at a time at 100k keys on two threads. Every key denied:
run medians 1.11 to 1.24 before, 1.39 to 1.53 after. Every key held:
1.01 to 1.07 before, 1.25 to 1.30 after. Every key allowed: 1.24 to 1.46
before, 1.29 to 1.60 after, within the rounds' spread. Those runs came
in one sitting, and compare before with after, not with a report's
tables: the report's run at `4aa91d6` gave 0.91 and 1.09 with every key
allowed on two threads, in runs where governor's times came out lower.

The case with every key allowed on two threads has been the least
steady. In the report's run at `0f3e8fc` its second run gave Sluice 52 ns
a decision and governor 60 ns as the two sides' medians, but 0.89 as
the median of the rounds' ratios (rounds 0.76 to 1.47). Its rounds were
of two kinds: governor's slice straight after its own took about 43 ns a
decision, and straight after Sluice's 53 to 60 ns, while Sluice's took
about 51 ns either way. Since commit `d7ec472` every round gives each
side one slice of each kind (see the method above).
{inserted_spread}
{one_key_paragraph}
The report's run at `6ca914f` was such a run: its first case, every key
allowed at 1 key on one thread, took Sluice 45.5 ns a decision in every
one of its 15 rounds (ratios 0.83 to 0.92), where its second run took
35.3 ns; governor's side took 39 ns in both. What slows one process's
Sluice side and not governor's is not known. It is not which CPU the
process runs on: on 2026-11-27, twenty runs pinned to each CPU by turns
(`taskset -c 0` and `-c 1`, `SLUICE_PAIRED_ONLY=allowed/1keys/1threads`)
gave slow processes on both.

With every key allowed, a decision still writes the table itself. The
bucket is full again by the key's next call, so it was dropped, and the
call inserts it anew and sweeps four slots for other full buckets. On
two threads at `4aa91d6`, `perf annotate` puts 17% of `single_locked`'s
samples on the lock's first load, and 11% on its release, which waits
for the decision's writes to the table to leave the core. `Slots::sweep`
and `Slots::insert_new` are 10% and 6% of all samples. Keeping full
buckets until a table needs room would save the insert and the sweep,
but a store of short-lived keys would then keep their memory instead of
giving it back, so it is left as it is. Keeping them only a little
longer does not save them: the bucket of this case is full a nanosecond
after its call, so whenever a sweep runs it drops whole probe runs at
once. Two such changes were measured on 2026-11-27 (callgrind, every key
allowed in the *inserted* shape at 100k keys on one thread) and dropped:
sparing a bucket until a whole pass of the sweep had gone by since it
filled took 818 instructions a decision against 726, and sweeping only
once a table is half full left the counts of inserts and sweeps as they
were.
""",
    "keyed-1m": """### Keyed decisions at 1M keys under Zipf traffic

Zipf traffic sends most calls to a few thousand keys, which stay in
cache on both sides, so the table's cache miss that separates the two at
1M shuffled keys happens only for the tail. The closest cases are those
where every key keeps a state (*allowed_held*): in `perf record` of
`SLUICE_PAIRED_ONLY=zipf:allowed_held/1Mkeys/1threads`, about 17% of the
samples are Sluice's `single_locked`, most of it the load of a tail
key's slot, besides SipHash; governor's map lookup and its comparison with
its copy of the key are about 42%. On two threads both sides also meet
on the hottest keys, and the rounds' ratios spread widely.
""",
    "rls": """### Envoy RLS against a bare tonic server

Both servers make one `sendto` a call (`perf stat -e
'syscalls:sys_enter_sendto'`), so the difference is the work of a call.
`scripts/serving-instructions rls rls-floor` counts it under callgrind,
one call at a time, most calls denied: at commit `1b24725`, about 66,200
instructions a call for `sluice serve` against about 52,400 for the
floor. `should_rate_limit` and what it calls take about 10,400, where
the floor's takes about 900, dropping the request as serve's does
(`KEEP_DIR=DIR` keeps the profiles for `callgrind_annotate
--inclusive=yes`): the decision and its metering about 2,400, the
problem body about 2,000 (building it about 550, writing it about
1,350), and the rest the answer, Envoy's header list (a `String` per
name and value, which prost needs) and the descriptors' statuses.
Encoding the larger answer through prost, and freeing it, is about 3,800
more; the floor answers OK with no headers and no body. A call every one
of whose descriptors is allowed carries no body and costs less (the
second RLS row).

Until commit `1b24725` the body went through serde_json's serializer,
which checks every byte of every string it writes for escapes, the field
names and the constant problem type included: about 3,500 instructions a
call, 67,700 in all at commit `8314562`. The body is now written with its
fixed parts as they are, and a string goes through serde_json only when
it holds something to escape; a property test holds the two outputs
equal.

The release build's link-time optimisation (commit `c0e0fff`) took
61,800 instructions a call down to 52,000 for the floor and 82,800 to
67,800 for serve, whose share of the floor's went from 0.75 to 0.77 (the
floor also took on the shutdown watch serve's server polls, about 240
instructions a call, in that commit). In time, each lost about 2 µs a
call: `scripts/bench-serving` (`LAYOUTS=0`, 5 rounds) measured a mostly
denied call at 9.1 µs against the floor's 7.2 with it, 0.78, where this
report had measured 11.2 µs against 9.2 at `3c474bd`, within the spread
of earlier runs either way.

What callgrind does not show: each call's future is moved into a box
(the RLS service trait boxes it), and `perf record` on either server
under load puts `memmove` at about 15% of its samples. A Redis call's
future, held inside the store's even with the store in memory, made a
call's future 2.4 KB. The server's store now boxes its Redis calls and
the enforcer its penalty gate, paths a memory store never takes, which
brings it to
1.1 KB (commit `9547073`; a test holds a decision's future under 768
bytes). The same `scripts/bench-serving`, after the store's half of
that change: 8.7 µs a mostly denied call against the floor's 7.2, 0.82,
and 8.4 µs against 7.2 with every call allowed.

Earlier cuts (commits `dd7cfaf` and `c1c6aff`): a denial's "retry in
1.234 s" is rounded in integers rather than by `format!("{{:.3}}")`,
except within a rounding error of a tie (checked by proptest against the
formatter), and a call's descriptors, rule hits and decisions stay off
the heap.

Both servers run tokio's single-threaded scheduler when pinned to one
CPU, which made a call cheaper on both sides and the floor cheaper by a
larger share: at commit `83dedc6`, on the multi-threaded scheduler, a
mostly denied call cost 17.0 µs against the floor's 14.1 (0.83). This
report measured the mostly denied row at 0.75 (rounds 0.68–0.81) at
commit `4f81888`, 0.80 (rounds 0.75–0.90) at `da627ee`, and, with a
cheaper memory store under it, 0.76 (rounds 0.70–0.82) at `ae1af00`,
0.88 (rounds 0.67–0.98) at `6d9ed6d` and 0.82 (rounds 0.81–0.99) at
`3c474bd`; with the link-time optimisation, 0.78 (rounds 0.64–0.86) at
`c0e0fff`, and with the smaller future 0.86 (rounds 0.73–1.11) at
`9547073`. Until commit `1b24725` a serving goal was judged on the ratio
of the two sides' medians; it is now the median of the rounds' own
ratios, as the tables' column has always said. With the problem body's
new writer, the run at `4a9eaf3` measured 0.88 (rounds 0.87–1.02); the
ratio of its two sides' medians was 0.89, and 0.81 against 0.82 with
every call allowed.
""",
    "proxy": """### `sluice proxy` against nginx

{bare_paragraph}The two proxies make the same
system calls a request, two `writev` and two `recvfrom`, and nearly as
many context switches, 0.45 a request against nginx's 0.38 (`perf stat
-e 'syscalls:sys_enter_*,context-switches'` on the proxy and on nginx's
worker). Their kernel time is about the same (utime and stime from
`/proc/PID/stat`): nginx's worker spends about 3 µs a request in user
space and 13 µs in the kernel, the proxy with its rule about 8.5 µs and
13 to 14 µs. The difference is user space: parsing and writing both
connections' messages with hyper, passing each request between the
client connection's task and the upstream connection's task (nginx does
both in one event loop), and the rule.

`scripts/serving-instructions proxy proxy-bare` counts a proxied request
under callgrind, one at a time: at commit `fcbaf66` about 49,700
instructions with the rule and 39,600 without; at `4f81888` 47,400 and
38,600. `perf record --call-graph dwarf` on the proxy under load puts
the largest single piece of the rule in setting the seven RateLimit
headers, 0.5 to 0.65 µs a request: `http`'s header map hashes a name that
is not one of its standard ones byte by byte, for every insert. The
decision itself is about 0.4 µs.

The cuts since `fcbaf66`, by what they removed: the seven header values
share one buffer and are inserted by `'static` name (allocations a
proxied request, counted with `perf probe` on jemalloc's `malloc`: 42
before, 23 after, all of the changes together); a request's rule hits
and store operations stay off the heap; a key's address is written in
place; the proxy rewrites a request before its future starts, holds the
client connection's upstream lane itself rather than in the request's
extensions, and clones one `Arc` per request where it cloned five; and a
connection reuses its timers, so neither hyper's wait for a request head
nor the wait for the upstream's answer enters a new sleep into tokio's
timer wheel per request (outside the runtime's park, the timers' share
of the proxy's samples went from 1.5% at `fcbaf66` to 0.75%).

The release build's link-time optimisation (commit `c0e0fff`) took a
proxied request from about 47,000 instructions to 42,800 with the rule,
and from 38,300 to 34,600 without (`scripts/serving-instructions proxy
proxy-bare`); nginx is the same build either way. The smaller decision
future of commit `9547073` (see the RLS section) is the proxy's too.

This report measured the proxy at 1.34× nginx (rounds 1.25–1.35) at
commit `4f81888`, before the timers were reused, and 1.27× (rounds
1.18–1.36) at `da627ee`; the four runs before commit `dd7cfaf`, 1.36×
to 1.41×. With the proxy's code unchanged since `da627ee` and a cheaper
memory store under it, it measured 1.24× (rounds 1.02–1.49) at
`ae1af00`, 1.36× (rounds 1.26–1.38) at `6d9ed6d` and 1.30× (rounds
1.21–1.33) at `3c474bd`. With the link-time optimisation it measured
1.48× (rounds 1.35–1.66) at `c0e0fff`, in a slow spell in which the
`sluice serve`'s RLS floor took 10.1 µs a call where it took 7.2 in the
hour around it, and in which `scripts/bench-serving` run by hand right
after measured the proxy with its rule at 1.18×; and 1.26× (rounds
1.07–1.41) at `9547073`.
A run still lands on either side of the goal.

Pinned to one CPU, as here, the proxy runs tokio's single-threaded
scheduler (`--threads`, which defaults to the CPUs the process may use).
Before, it ran the multi-threaded one with a single worker, which
decides the same but made 0.68 context switches a request instead of
0.45: `scripts/bench-report` at commit `83dedc6` measured 23.6 µs a
request against nginx's 16.6, 1.42×. The bare servers the other
comparisons use build their runtime the same way, so those ratios
compare like with like.
""",
}

METHODS = """
## Instruction counts

Counts from callgrind do not drift with the machine, so they explain the
ratios above. They are measured by the commands named, not by
`scripts/bench-report`, and the middleware's and serve's were taken at
commit `7d83888`, before the RateLimit headers stopped going through a
header map for RLS and the decision API.

- **The release build** is one optimisation unit over every crate
  (`lto = "fat"`, `codegen-units = 1` in the workspace's `Cargo.toml`), so
  that the small functions of hyper, h2, prost and `bytes` inline into the
  request path. `scripts/serving-instructions`, at commit `b7609a2`,
  before and after it: the proxy with its rule 47,000 instructions a
  request, then 42,800; with no rule 38,300, then 34,600; RLS, most calls
  denied, 82,800, then 67,800; its floor 61,800, then 52,000. Thin
  link-time optimisation (`lto = "thin"`) took about half of that off.
  The price is the build: about 5 min 15 s for a first release build on
  this machine instead of 4 min 25 s, and about 2 min 20 s to rebuild
  after a change to one crate, almost all of it the link.
- **The benchmarks** (`cargo bench`) build with cargo's release
  settings, crate by crate (`[profile.bench]`): they compare libraries,
  and that is how a library's users build it unless they choose
  otherwise. Under the binary's link-time optimisation, governor's keyed
  decision took about 383 instructions where it takes 414, and Sluice's
  428 on one key and 594 on 100k keys where it takes 410 and 579
  (`scripts/keyed-instructions` at commit `c0e0fff`): the paired
  comparison at `c0e0fff`, made that way, put Sluice at 0.72 of
  governor's speed on one key and a thread. In Sluice's build, SipHash's
  `write` and the benchmark's call into the store stopped being inlined.
- **Keyed, in process**: see the instructions per decision under the
  keyed tables above, which this script counts on every run. Much of
  each side's count is SipHash. Sluice keeps it: a key is held as its
  64-bit fingerprint, and a keyed PRF is what keeps anyone from aiming a
  key at someone else's bucket.
- **Redis** (`scripts/redis-instructions`, redis-server's instructions per
  decision on *mixed* traffic): the naive script about 68,000; Sluice's
  token bucket about 33,700 (batches of about 20 decisions a script call),
  its sliding window about 53,300 and its sliding log about 68,600 (at
  commit `2724aa6` about 55,500: the log's count rose before issue 40,
  in the commits that bounded fat keys; not bisected further). Of
  the token bucket's, the one `SET ... PX` an admitted decision needs
  costs about 7,000 through Lua's `redis.call`; the sliding log rewrites
  its whole value on every admission.
- **The middleware** (`cargo bench -p sluice-http --bench layer`): one
  per-IP rule adds about 12,800 instructions to an admitted request (the
  key, the decision and seven headers, mostly the `http` crate's header
  map) and 2,200 to an unmatched one.
- **`sluice serve`**: a `POST /v1/limit` call is about 20,100 instructions,
  against 11,800 in the bare hyper server; `/v1/limit` and `/v1/check`
  bypass axum's router, which would cost about 3,000 more.
  `scripts/allocator-compare` measured jemalloc, mimalloc and glibc's
  malloc side by side: the allocator is about 1,200 instructions of a
  call under jemalloc, and requests per server CPU-second did not differ
  beyond the rounds' spread.

Memory at 1M keys (`cargo run --release -p sluice-core --example
bytes_per_key`): 51 bytes per key for the token bucket (governor: 101),
70 for the sliding window, 152 for a sliding log of one entry and 16 for
each further entry.
"""


if __name__ == "__main__":
    main()
