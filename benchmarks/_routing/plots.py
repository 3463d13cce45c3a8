# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The benchmarks' one plotting path: the studies' plots, drawn with matplotlib into deterministic SVG files (the same rows give the same bytes).

Deterministic: the Agg backend, a fixed ``svg.hashsalt`` (the ids of clip paths and glyphs), text kept as text
(``svg.fonttype`` none: no embedded glyph outlines), no date metadata. ``ttft_against_load`` draws one line per policy of
its TTFT p90 at each step of the load ramp (mean over the seeds, the min-max as a band), one panel per workload;
``hit_rate_against_limit`` one bar per policy of its hit rate (mean, min-max whisker) beside the referee's limit (a line);
``summary_bars`` a bar per policy and workload of one metric of a study's summary (the routing study's hit rate and TTFT).
"""

from __future__ import absolute_import, division, print_function

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

STYLE = {"svg.hashsalt": "inference-cache-substrate", "svg.fonttype": "none", "font.size": 9, "axes.grid": True,
         "grid.color": "#dddddd", "figure.dpi": 100}
COLOURS = ("#000000", "#4477aa", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#aa3377", "#bbbbbb", "#555555")
METADATA = {"Date": None, "Creator": None}


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return sum(values) / len(values), min(values), max(values)


def _workloads(rows):
    return list(dict.fromkeys(r["workload"] for r in rows))


def _policies(rows):
    return list(dict.fromkeys(r["policy"] for r in rows))


def _save(fig, path):
    fig.savefig(path, format="svg", metadata=METADATA)
    plt.close(fig)


def ttft_against_load(rows, path, title="TTFT p90 against load"):
    """One panel per workload: per policy, TTFT p90 (ms, log scale) at each QPS step of the ramp."""
    workloads, policies = _workloads(rows), _policies(rows)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(workloads), figsize=(4.6 * len(workloads), 3.6), squeeze=False)
        for ax, workload in zip(axes[0], workloads):
            for colour, policy in zip(COLOURS * 3, policies):
                mine = [r for r in rows if r["workload"] == workload and r["policy"] == policy]
                if not mine:
                    continue
                qps = [step["qps"] for step in mine[0]["steps"]]
                stats = [_stats([r["steps"][i]["ttft_ms_p90"] for r in mine if i < len(r["steps"])]) for i in range(len(qps))]
                points = [(q, s) for q, s in zip(qps, stats) if s[0] is not None]
                if not points:
                    continue
                xs = [q for q, _s in points]
                ax.plot(xs, [s[0] for _q, s in points], marker="o", markersize=3, color=colour, label=policy,
                        linestyle="--" if policy == "referee" else "-")
                ax.fill_between(xs, [s[1] for _q, s in points], [s[2] for _q, s in points], color=colour, alpha=0.15, linewidth=0)
            ax.set_yscale("log")
            ax.set_xlabel("offered load (requests/s)")
            ax.set_ylabel("TTFT p90 (ms)")
            ax.set_title(workload)
        handles = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=7)
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0, 0.85, 1))
        _save(fig, path)


def hit_rate_against_limit(rows, path, title="Hit rate against the referee's limit", limit="referee"):
    """One panel per workload: per policy its hit rate (mean, min-max whisker); the referee's mean as a dashed line."""
    workloads, policies = _workloads(rows), [p for p in _policies(rows) if p != limit]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(workloads), figsize=(4.6 * len(workloads), 3.6), squeeze=False)
        for ax, workload in zip(axes[0], workloads):
            ref = _stats([r["hit_rate"] for r in rows if r["workload"] == workload and r["policy"] == limit])
            for i, (colour, policy) in enumerate(zip(COLOURS[1:] * 3, policies)):
                mean, low, high = _stats([r["hit_rate"] for r in rows if r["workload"] == workload and r["policy"] == policy])
                if mean is None:
                    continue
                ax.bar(i, 100 * mean, color=colour, width=0.7)
                ax.errorbar(i, 100 * mean, yerr=[[100 * (mean - low)], [100 * (high - mean)]], color="black", capsize=3, linewidth=1)
            if ref[0] is not None:
                ax.axhline(100 * ref[0], color="black", linestyle="--", linewidth=1, label="referee (the limit) %.1f%%" % (100 * ref[0]))
                ax.legend(loc="lower left", fontsize=7)
            ax.set_xticks(range(len(policies)))
            ax.set_xticklabels(policies, rotation=30, ha="right")
            ax.set_ylim(0, 100)
            ax.set_ylabel("prefix-cache hit rate (%)")
            ax.set_title(workload)
        fig.suptitle(title)
        fig.tight_layout()
        _save(fig, path)


def summary_bars(summary, metric, path, title, unit, percent=False):
    """One group of bars per workload, a bar per policy (the same colour in every group): the mean of ``metric`` over the
    seeds with its min-max as a whisker, from the rows of a study's summary (``{"workload", "policy", metric: {"mean",
    "min", "max"}}``); a policy without a value in a workload has no bar there."""
    workloads = list(dict.fromkeys(r["workload"] for r in summary))
    policies = list(dict.fromkeys(r["policy"] for r in summary))
    scale = 100.0 if percent else 1.0
    width = 0.8 / max(len(policies), 1)
    labelled = set()
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(4.6, 1.2 + 0.9 * len(workloads) * max(len(policies), 1) * 0.5), 3.6))
        for j, (colour, policy) in enumerate(zip(COLOURS[1:] * 3, policies)):
            for i, workload in enumerate(workloads):
                row = [r for r in summary if r["workload"] == workload and r["policy"] == policy]
                stats = row[0][metric] if row else {}
                if not stats or stats.get("mean") is None:
                    continue
                x = i - 0.4 + width * (j + 0.5)
                mean, low, high = (scale * stats[k] for k in ("mean", "min", "max"))
                ax.bar(x, mean, width=width * 0.9, color=colour, label=None if policy in labelled else policy,
                       gid="bar %s %s" % (workload, policy))
                labelled.add(policy)
                ax.errorbar(x, mean, yerr=[[mean - low], [high - mean]], color="black", capsize=2, linewidth=1)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, rotation=20, ha="right")
        ax.set_ylabel("%s (%%)" % unit if percent else unit)
        if percent:
            ax.set_ylim(0, 100)
        if labelled:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
        ax.set_title(title)
        fig.tight_layout()
        _save(fig, path)
