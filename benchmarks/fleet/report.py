# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study's rows, summary, tables and plots.

``row(...)``: one configuration (policy, seed) from its records: per step of the ramp (the warm-up is not measured) the
offered rate; the hit rate (cached over prompt tokens, what the engines reported) beside the compulsory-miss bound; TTFT
p50, p90, p99; the time in the engine's queue (from the books: sent to running) as mean, p90 and max; the waiting requests
per engine (the books sampled every 100 ms: mean, p90 and max over every engine's samples) and the engines' own
``vllm:num_requests_waiting`` read every second beside them; requests and prefix groups per engine; HTTP 429 and 500 counts;
the goodput (requests answered within the TTFT target, per second); and the sustained rate: the highest offered rate at
which that step and every lower one kept TTFT p90 within the target and failed at most 1% of its requests.

``summarize(rows)``: per policy, the sustained rate and per step the metrics over the seeds (mean, min, max).
``markdown(summary, rows)``: the tables. ``write(folder, rows)``: runs.jsonl, summary.json, report.md and the plots (TTFT p90
and p99 against the offered rate, hit rate against the rate with the bound, requests per engine), drawn with matplotlib
into SVG files that are the same bytes for the same rows (fixed ``svg.hashsalt``, text as text, no date).
"""

from __future__ import absolute_import, division, print_function

import json
import math
import os

DASH = "\u2013"
ERROR_SHARE = 0.01


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    pos = (len(values) - 1) * q / 100.0
    low = int(math.floor(pos))
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def _ms(value):
    return None if value is None else round(1000.0 * value, 1)


def _dist(values, scale=1.0):
    values = [v * scale for v in values if v is not None]
    if not values:
        return {"mean": None, "p90": None, "max": None}
    return {"mean": round(sum(values) / len(values), 3), "p90": round(percentile(values, 90), 3), "max": round(max(values), 3)}


def step_metrics(records, samples, gauges, names, rate, seconds, window, target_s):
    """The metrics of one step (``records`` its requests; ``samples``/``gauges`` all of the run's; ``window`` its seconds)."""
    ok = [r for r in records if r.get("status") == 200 and "cached" in r]
    ttfts = [r["ttft"] for r in ok]
    prompt = sum(r["prompt_tokens"] for r in ok)
    in_window = [s for s in samples if window[0] <= s["t"] < window[1]]
    g_window = [g for g in gauges if window[0] <= g["t"] < window[1]]
    per_engine = dict((n, 0) for n in names)
    groups = dict((n, set()) for n in names)
    for r in records:
        if r.get("engine") in per_engine:
            per_engine[r["engine"]] += 1
            groups[r["engine"]].add(r["group"])
    statuses = [r.get("status") for r in records]
    within = sum(1 for t in ttfts if t <= target_s)
    return {
        "rate": rate, "requests": len(records), "ok": len(ok),
        "http_429": statuses.count(429), "http_500": statuses.count(500),
        "failed": len(records) - len(ok),
        "hit_rate": round(sum(r["cached"] for r in ok) / float(prompt), 4) if prompt else None,
        "bound": round(sum(r["bound"] for r in ok) / float(prompt), 4) if prompt else None,
        "ttft_ms": {"p50": _ms(percentile(ttfts, 50)), "p90": _ms(percentile(ttfts, 90)), "p99": _ms(percentile(ttfts, 99))},
        "queue_ms": dict((k, None if v is None else round(v, 1)) for k, v in _dist([r.get("queue") for r in ok], 1000.0).items()),
        "waiting": _dist([w for s in in_window for w in s["waiting"]]),
        "waiting_reported": _dist([w for g in g_window for w in g["waiting"] if w is not None]),
        "requests_per_engine": [per_engine[n] for n in names],
        "groups_per_engine": [len(groups[n]) for n in names],
        "goodput_rps": round(within / float(seconds), 3) if seconds else None,
        "within_target": round(within / float(len(records)), 4) if records else None,
        "held_best": round(sum(1 for r in records if r.get("engine") and r.get("truth_picked") == r.get("truth_best"))
                           / float(len(records)), 4) if records else None,
        "pick_ms_mean": round(sum(r.get("pick_ms", 0.0) for r in records) / float(len(records)), 2) if records else None,
    }


def sustained(steps, target_ms):
    """The highest offered rate at which that step and every lower one kept TTFT p90 within the target and failed at most
    1% of its requests (0.0 when the first step did not)."""
    best = 0.0
    for step in steps:
        p90 = step["ttft_ms"]["p90"]
        if p90 is None or p90 > target_ms or step["failed"] > ERROR_SHARE * max(1, step["requests"]):
            break
        best = step["rate"]
    return best


def _counter_delta(meta, name):
    total = 0.0
    for engine, after in (meta.get("after") or {}).items():
        before = (meta.get("before") or {}).get(engine)
        if before and after:
            total += after[name] - before[name]
    return total


def row(policy, router, seed, spec, names, records, samples, gauges, meta, target_s=1.0):
    """One configuration's row (see the module's docstring)."""
    seconds = float(spec["step_seconds"])
    start = float(meta.get("ramp_start") or 0.0)
    steps = []
    for k, rate in enumerate(spec["ramp"]):
        window = (start + k * seconds, start + (k + 1) * seconds)
        steps.append(step_metrics([r for r in records if r["step"] == k], samples, gauges, names, rate, seconds, window, target_s))
    ramp = [r for r in records if r["step"] >= 0]
    whole = step_metrics(ramp, samples, gauges, names, None, seconds * len(spec["ramp"]),
                         (start, start + seconds * len(spec["ramp"])), target_s)
    hits, queries = _counter_delta(meta, "vllm:prefix_cache_hits"), _counter_delta(meta, "vllm:prefix_cache_queries")
    queue_sum = _counter_delta(meta, "vllm:request_queue_time_seconds_sum")
    queue_count = _counter_delta(meta, "vllm:request_queue_time_seconds_count")
    sent = [r for r in records if r.get("engine")]
    # the simulator observes a queue time only for the requests it took from its waiting queue (simulator.go dequeue)
    queued = [r for r in sent if r.get("queued") and r.get("queue") is not None]
    errors_seen = sorted(set(r["error"][:100] for r in records if r.get("error")))
    return {
        "policy": policy, "router": router, "seed": seed, "target_ms": 1000.0 * target_s,
        "engines": len(names), "groups": int(spec["groups"]), "demand": round(_demand(spec), 3),
        "ramp": list(spec["ramp"]), "step_seconds": seconds, "warmup_requests": int(spec["warmup_requests"]),
        "sustained_rps": sustained(steps, 1000.0 * target_s),
        "steps": steps, "ramp_total": whole,
        "idle_engines": sum(1 for n in whole["requests_per_engine"] if n == 0),
        "validation": {
            # the engines' own counters over the whole configuration (warm-up included) beside the records' figures
            "counter_hit_rate": round(hits / queries, 4) if queries else None,
            "records_hit_rate": _hit_rate([r for r in sent if r.get("status") == 200]),
            "engine_queue_ms_mean": round(1000.0 * queue_sum / queue_count, 1) if queue_count else None,
            "engine_queued": int(queue_count),
            "books_queue_ms_mean": round(1000.0 * sum(r["queue"] for r in queued) / len(queued), 1) if queued else None,
            "books_queued": len(queued),
        },
        "failures": errors_seen[:3],
    }


def _hit_rate(records):
    prompt = sum(r["prompt_tokens"] for r in records if "cached" in r)
    return round(sum(r["cached"] for r in records if "cached" in r) / float(prompt), 4) if prompt else None


def _demand(spec):
    fleet_tokens = int(spec["engines"]) * int(spec["capacity_blocks"]) * int(spec["block_size"])
    group = int(spec["prefix_tokens"]) + int(spec["users"]) * int(spec["question_tokens"])
    return int(spec["groups"]) * group / float(fleet_tokens)


# ---- over the seeds ----------------------------------------------------------------------------------

def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": round(sum(values) / len(values), 4), "min": min(values), "max": max(values)}


def summarize(rows):
    """Per policy (in first-seen order): runs, the sustained rate, and per step each headline metric over the seeds."""
    by_policy = {}
    for r in rows:
        by_policy.setdefault(r["policy"], []).append(r)
    out = []
    for policy, members in by_policy.items():
        steps = []
        for k, rate in enumerate(members[0]["ramp"]):
            mine = [m["steps"][k] for m in members if k < len(m["steps"])]
            steps.append({"rate": rate,
                          "hit_rate": _stats([s["hit_rate"] for s in mine]), "bound": _stats([s["bound"] for s in mine]),
                          "ttft_p50": _stats([s["ttft_ms"]["p50"] for s in mine]),
                          "ttft_p90": _stats([s["ttft_ms"]["p90"] for s in mine]),
                          "ttft_p99": _stats([s["ttft_ms"]["p99"] for s in mine]),
                          "queue_mean": _stats([s["queue_ms"]["mean"] for s in mine]),
                          "waiting_mean": _stats([s["waiting"]["mean"] for s in mine]),
                          "waiting_max": _stats([s["waiting"]["max"] for s in mine]),
                          "goodput": _stats([s["goodput_rps"] for s in mine]),
                          "failed": sum(s["failed"] for s in mine), "http_429": sum(s["http_429"] for s in mine),
                          "http_500": sum(s["http_500"] for s in mine)})
        out.append({"policy": policy, "router": members[0]["router"], "runs": len(members),
                    "seeds": [m["seed"] for m in members],
                    "sustained": _stats([m["sustained_rps"] for m in members]),
                    "sustained_by_seed": [m["sustained_rps"] for m in members],
                    "hit_rate": _stats([m["ramp_total"]["hit_rate"] for m in members]),
                    "idle_engines": max(m["idle_engines"] for m in members),
                    "steps": steps})
    return out


def _fmt(value, digits=0, pct=False):
    if value is None:
        return "-"
    if pct:
        return "%.1f%%" % (100.0 * value)
    return ("%%.%df" % digits) % value


def _range(stats, digits=0, pct=False):
    if stats["mean"] is None:
        return "-"
    if stats["min"] == stats["max"]:
        return _fmt(stats["mean"], digits, pct)
    if pct:
        return "%s (%.1f%s%.1f)" % (_fmt(stats["mean"], digits, pct), 100.0 * stats["min"], DASH, 100.0 * stats["max"])
    return "%s (%s%s%s)" % (_fmt(stats["mean"], digits), _fmt(stats["min"], digits), DASH, _fmt(stats["max"], digits))


def _step_index(summary, rate):
    rates = summary[0]["steps"] if summary else []
    for k, step in enumerate(rates):
        if step["rate"] == rate:
            return k
    return None


def headline_rates(summary):
    """Three offered rates for the headline table: the first step, the highest random sustains (else the middle), and the
    last."""
    rates = [s["rate"] for s in summary[0]["steps"]] if summary else []
    if not rates:
        return []
    random_row = [e for e in summary if e["policy"] == "random"]
    middle = random_row[0]["sustained"]["max"] if random_row and random_row[0]["sustained"]["max"] else rates[len(rates) // 2]
    if middle not in rates or middle in (rates[0], rates[-1]):
        middle = rates[len(rates) // 2]
    return [rates[0], middle, rates[-1]]


def markdown(summary, rows, title="Routing over a simulated fleet", notes=()):
    lines = ["# %s" % title, ""]
    if not summary:
        return "\n".join(lines + ["No runs."]) + "\n"
    target = rows[0]["target_ms"]
    loads = headline_rates(summary)
    lines += ["## Headline", "",
              "Sustained rate: the highest offered rate (requests/s) at which that step and every lower one kept TTFT p90 within "
              "%.0f ms and failed at most 1%% of its requests. Hit rate over the whole ramp; TTFT p90 in ms at three offered "
              "rates. Mean over the seeds, (min%smax)." % (target, DASH), "",
              "| Policy | Router | Sustained req/s (per seed) | Hit rate | %s |" % " | ".join("p90 @ %g req/s" % r for r in loads),
              "|---|---|---|---|%s" % ("---|" * len(loads))]
    for entry in summary:
        cells = []
        for rate in loads:
            k = _step_index(summary, rate)
            cells.append(_range(entry["steps"][k]["ttft_p90"]) if k is not None and k < len(entry["steps"]) else "-")
        lines.append("| %s | %s | %s (%s) | %s | %s |" % (
            entry["policy"], entry["router"], _fmt(entry["sustained"]["mean"], 1),
            ", ".join(_fmt(v, 0) for v in entry["sustained_by_seed"]), _range(entry["hit_rate"], pct=True), " | ".join(cells)))
    rates = [s["rate"] for s in summary[0]["steps"]]
    for key, label, fmt in (("ttft_p90", "TTFT p90 (ms)", {}), ("ttft_p99", "TTFT p99 (ms)", {}),
                            ("ttft_p50", "TTFT p50 (ms)", {}),
                            ("hit_rate", "Hit rate (compulsory-miss bound in the last row)", {"pct": True}),
                            ("queue_mean", "Mean time in the engine's queue (ms, from the books)", {}),
                            ("waiting_mean", "Waiting requests per engine, mean (books, every 100 ms)", {"digits": 2}),
                            ("waiting_max", "Waiting requests per engine, max", {}),
                            ("goodput", "Goodput: requests/s answered within the target", {"digits": 1})):
        lines += ["", "## %s by offered rate" % label, "",
                  "| Policy | %s |" % " | ".join("%g" % r for r in rates), "|---|%s" % ("---|" * len(rates))]
        for entry in summary:
            lines.append("| %s | %s |" % (entry["policy"], " | ".join(_fmt(s[key]["mean"], **fmt) for s in entry["steps"])))
        if key == "hit_rate":
            lines.append("| bound | %s |" % " | ".join(_fmt(s["bound"]["mean"], pct=True) for s in summary[0]["steps"]))
    lines += ["", "## Failures by offered rate (HTTP 429 / 500, all seeds)", "",
              "| Policy | %s |" % " | ".join("%g" % r for r in rates), "|---|%s" % ("---|" * len(rates))]
    for entry in summary:
        lines.append("| %s | %s |" % (entry["policy"], " | ".join("%d / %d" % (s["http_429"], s["http_500"]) for s in entry["steps"])))
    lines += ["", "## Requests and prefix groups per engine (whole ramp)", "",
              "| Policy | Seed | Requests per engine (min / median / max) | Idle engines | Groups per engine (min%smax) |" % DASH,
              "|---|---|---|---|---|"]
    for r in rows:
        counts = sorted(r["ramp_total"]["requests_per_engine"])
        groups = r["ramp_total"]["groups_per_engine"]
        lines.append("| %s | %d | %d / %d / %d | %d | %d%s%d |" % (
            r["policy"], r["seed"], counts[0], counts[len(counts) // 2], counts[-1], r["idle_engines"], min(groups), DASH, max(groups)))
    lines += ["", "## Checks of the records against the engines' own counters (whole configuration, warm-up included)", "",
              "| Policy | Seed | Hit rate: engines' counters / records | Queued requests: engines' histogram / books "
              "| Their mean ms in the queue: engines / books |", "|---|---|---|---|---|"]
    for r in rows:
        v = r["validation"]
        lines.append("| %s | %d | %s / %s | %s / %s | %s / %s |" % (
            r["policy"], r["seed"], _fmt(v["counter_hit_rate"], pct=True), _fmt(v["records_hit_rate"], pct=True),
            _fmt(v.get("engine_queued")), _fmt(v.get("books_queued")), _fmt(v["engine_queue_ms_mean"], 1), _fmt(v["books_queue_ms_mean"], 1)))
    if notes:
        lines += ["", "## Notes", ""] + ["- %s" % n for n in notes]
    return "\n".join(lines) + "\n"


# ---- plots -------------------------------------------------------------------------------------------

STYLE = {"svg.hashsalt": "inference-cache-substrate-fleet", "svg.fonttype": "none", "font.size": 9, "axes.grid": True,
         "grid.color": "#dddddd", "figure.dpi": 100}
COLOURS = ("#000000", "#4477aa", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#aa3377", "#bbbbbb", "#555555", "#994455")
METADATA = {"Date": None, "Creator": None}


def _plt():
    import matplotlib   # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt   # pylint: disable=import-outside-toplevel
    return plt


def _save(plt, fig, path):
    fig.savefig(path, format="svg", metadata=METADATA)
    plt.close(fig)


def plot_latency(summary, path, key, label, target_ms):
    plt = _plt()
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for i, entry in enumerate(summary):
            points = [(s["rate"], s[key]) for s in entry["steps"] if s[key]["mean"] is not None]
            if not points:
                continue
            xs = [p[0] for p in points]
            colour = COLOURS[i % len(COLOURS)]
            ax.plot(xs, [p[1]["mean"] for p in points], marker="o", markersize=3, color=colour, label=entry["policy"])
            ax.fill_between(xs, [p[1]["min"] for p in points], [p[1]["max"] for p in points], color=colour, alpha=0.15, linewidth=0)
        ax.axhline(target_ms, color="#888888", linestyle="--", linewidth=1, label="target %.0f ms" % target_ms)
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("%s (ms, log scale)" % label)
        ax.set_title("%s against offered rate (line: mean of the seeds; band: min-max)" % label)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        _save(plt, fig, path)


def plot_hit_rate(summary, path):
    plt = _plt()
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for i, entry in enumerate(summary):
            points = [(s["rate"], s["hit_rate"]["mean"]) for s in entry["steps"] if s["hit_rate"]["mean"] is not None]
            if points:
                ax.plot([p[0] for p in points], [100 * p[1] for p in points], marker="o", markersize=3,
                        color=COLOURS[i % len(COLOURS)], label=entry["policy"])
        bound = [(s["rate"], s["bound"]["mean"]) for s in summary[0]["steps"] if s["bound"]["mean"] is not None]
        if bound:
            ax.plot([b[0] for b in bound], [100 * b[1] for b in bound], color="#888888", linestyle="--", label="compulsory-miss bound")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("hit rate (% of prompt tokens cached)")
        ax.set_ylim(0, 100)
        ax.set_title("Hit rate against offered rate (mean of the seeds)")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        _save(plt, fig, path)


def plot_per_engine(rows, path):
    plt = _plt()
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        width = 0.8 / max(1, len(policies))
        for i, policy in enumerate(policies):
            mine = [r for r in rows if r["policy"] == policy]
            counts = [sorted(r["ramp_total"]["requests_per_engine"], reverse=True) for r in mine]
            mean = [sum(c[j] for c in counts) / float(len(counts)) for j in range(len(counts[0]))]
            xs = [j + (i - (len(policies) - 1) / 2.0) * width for j in range(len(mean))]
            ax.bar(xs, mean, width=width, color=COLOURS[i % len(COLOURS)], label=policy)
        ax.set_xlabel("engines, busiest first")
        ax.set_ylabel("requests in the ramp (mean of the seeds)")
        ax.set_title("Requests per engine")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        _save(plt, fig, path)


FILES = ("runs.jsonl", "summary.json", "report.md", "ttft_p90.svg", "ttft_p99.svg", "hit_rate.svg", "requests_per_engine.svg")


def write(folder, rows, notes=(), title="Routing over a simulated fleet"):
    """The study folder: every file of ``FILES``; returns ``{file: path}``."""
    os.makedirs(folder, exist_ok=True)
    paths = dict((name, os.path.join(folder, name)) for name in FILES)
    summary = summarize(rows)
    with open(paths["runs.jsonl"], "w", encoding="utf-8") as out:
        for r in rows:
            out.write(json.dumps(r, sort_keys=True) + "\n")
    with open(paths["summary.json"], "w", encoding="utf-8") as out:
        json.dump(summary, out, indent=1, sort_keys=True)
        out.write("\n")
    with open(paths["report.md"], "w", encoding="utf-8") as out:
        out.write(markdown(summary, rows, title, notes))
    target = rows[0]["target_ms"] if rows else 1000.0
    plot_latency(summary, paths["ttft_p90.svg"], "ttft_p90", "TTFT p90", target)
    plot_latency(summary, paths["ttft_p99.svg"], "ttft_p99", "TTFT p99", target)
    plot_hit_rate(summary, paths["hit_rate.svg"])
    plot_per_engine(rows, paths["requests_per_engine.svg"])
    return paths


def read_rows(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
