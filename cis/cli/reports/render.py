"""A report (``cis.cli.reports.builder.build_report``) as text for the terminal and as markdown.

Latencies arrive in seconds (:mod:`cis.core.records`) and are shown in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cis.cli.reports.compare import CHECKED_ACCURACY_VIEWS, CHECKED_SHARE_VIEWS, VIEW_LABELS
from cis.core.records import format_ms

LATENCY_COLUMNS = ("mean_s", "p50_s", "p95_s", "p99_s")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _requests(r: Mapping[str, Any] | None) -> str:
    """A simulation's request counts, e.g. "6043 arrived, 6043 served, 0 dropped"."""
    r = r or {}
    return ", ".join(f"{r.get(k, '-')} {k}" for k in ("arrived", "served", "dropped"))


def _lat(lat: Mapping[str, Any] | None, *keys: str) -> str:
    """``mean 1.84 p50 1.42 ...``: the named latency summary values in ms."""
    lat = lat or {}
    return " ".join(f"{k.removesuffix('_s')} {format_ms(lat.get(k))}" for k in keys)


# ---------------------------------------------------------------- text


def comparison_lines(c: Mapping[str, Any]) -> list[str]:
    """The short text: accuracy, shares and latency per view."""
    acc, shares, lat, agr = c["accuracy"], c["served_share"], c["latency"], c["agreement"]
    exits = list(shares["calculus"])
    lines = [
        "CIS accuracy:    "
        + "   ".join(f"{VIEW_LABELS[k].split(' (')[0]} {_pct(acc.get(k))}" for k in CHECKED_ACCURACY_VIEWS),
        "served per exit: " + " ".join(f"{'':>9}exit {e}" for e in exits),
    ]
    for k in (*CHECKED_SHARE_VIEWS, "sim_bundle_profile"):
        if k in shares:
            lines.append(f"  {VIEW_LABELS[k]:<32}" + " ".join(f"{_pct(shares[k].get(e)):>15}" for e in exits))
    lines.append(
        f"latency ms:      runtime {_lat(lat.get('runtime'), 'p50_s', 'p99_s')}   "
        f"simulator {_lat(lat.get('sim'), 'p50_s', 'p99_s')}"
    )
    lines.append(
        f"agreement:       offline/runtime/simulator shares within {100 * agr['share_max_gap']:.1f} points, "
        f"accuracy within {100 * agr['accuracy_max_gap']:.1f} points "
        f"(tolerance {100 * agr['share_tolerance']:.0f}) -> {'OK' if agr['ok'] else 'DISAGREE'}; "
        f"test-set drift from the calculus {100 * agr['calculus_gap']:.1f} points"
    )
    return lines


def _run_head(r: Mapping[str, Any], of: str) -> str:
    """dataset, method, strategy and rounds, what is unknown said so (the file it comes from missing)."""
    missing = r.get("missing") or []
    unknown = "unknown (no config.json)" if "config.json" in missing else "unknown"
    rounds = (f"{r['rounds_done']}{of}{'?' if r['rounds'] is None else r['rounds']} rounds"
              if "metrics.jsonl" not in missing else "no rounds recorded (no metrics.jsonl)")
    return (f"{r['dataset'] or 'dataset ' + unknown}, method {r['method']}, strategy {r['strategy'] or unknown}, "
            f"{rounds}")


def _run_text(r: Mapping[str, Any]) -> list[str]:
    lines = [f"run {r['path']}: {_run_head(r, '/')}, {r['train_seconds']:.1f} s"]
    f = r.get("final")
    if f:
        per_exit = [f"exit {e} {_pct(a)}" for e, a in (f["exit_accuracy"] or {}).items()]
        lines += [f"test accuracy per exit: {', '.join(per_exit)}",
                  f"CIS accuracy (quota): {_pct(f['cis_accuracy_quota'])}"]
    return lines


def _bundle_text(b: Mapping[str, Any]) -> list[str]:
    lines = [f"bundle {b['path']}: {len(b['stages'])} stages, carries {b['feature_dtype']}, {b['files']}"]
    cal = b.get("calibration") or {}
    if cal:
        target, achieved = cal["target_share_per_exit"], cal.get("achieved_share_per_exit", {})
        shares = [f"exit {e} {_pct(s)} (target {_pct(target.get(e))})" for e, s in achieved.items()]
        lines += [f"calibrated share per exit: {', '.join(shares)}",
                  f"CIS accuracy on validation: {_pct(cal.get('cis_accuracy'))}"]
    batch1 = [f"stage {k} {format_ms(v.get('1'))}" for k, v in b["latency_profile_s"].items()]
    return [*lines, f"latency ms/call at batch 1: {', '.join(batch1)}"]


def text_summary(report: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    lines: list[str] = []
    if report["kind"] == "demo":
        s = report.get("settings") or {}
        lines.append(
            f"cis demo: {s.get('dataset')}, {s.get('topology')} {s.get('serving')}, {s.get('rounds')} rounds, "
            f"{s.get('requests')} requests at {s.get('rate'):g}/s"
        )
        lines += comparison_lines(report["comparison"])
        t = report.get("timings_s") or {}
        if t:
            lines.append("time s:          " + "  ".join(f"{k} {v:.1f}" for k, v in t.items()))
        return "\n".join(lines)
    if "run" in report:
        lines += _run_text(report["run"])
    if "bundle" in report:
        lines += _bundle_text(report["bundle"])
    if "sim" in report:
        s = report["sim"]
        shares = [f"exit {e} {_pct(x['share'])} (calculus {_pct(x['calculus_share'])})" for e, x in s["exits"].items()]
        lines += [f"simulation {s['path']}: requests {_requests(s['requests'])}; accuracy {_pct(s['accuracy'])}, "
                  f"latency ms {_lat(s['latency'], 'mean_s', 'p50_s', 'p99_s')}",
                  f"served per exit: {', '.join(shares)}"]
    if "runtime" in report:
        r = report["runtime"]
        lines.append(f"runtime {r['path']}: {r['answered']} of {r['requests']} answered, "
                     f"accuracy {_pct(r['accuracy'])}, latency ms {_lat(r['latency'], 'p50_s', 'p99_s')}")
    return "\n".join(lines)


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _latency_row(name: str, lat: Mapping[str, Any] | None) -> list[str]:
    return [name, *[format_ms((lat or {}).get(k)) for k in LATENCY_COLUMNS]]


LATENCY_HEADER = ["latency (ms)", "mean", "p50", "p95", "p99"]


def _demo_md(report: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    s = report.get("settings") or {}
    c = report["comparison"]
    agr = c["agreement"]
    md = [
        f"{s.get('dataset')}, topology {s.get('topology')}, serving {s.get('serving')}, {s.get('strategy')} weights, "
        f"{s.get('rounds')} rounds; {s.get('requests')} test requests at {s.get('rate'):g} requests/s, "
        f"seed {s.get('seed')}.\n",
        "## The three views\n",
        "Offline: the bundle's graphs on the test samples with the threshold policy "
        "(`evaluate_cis(policy=bundle.policy)`). "
        "Runtime: the same samples sent through the leaves (`assign_entries`) to the node processes. "
        "Simulator: the same samples, entry nodes and send times in SimPy, with the per-visit cost calibrated on "
        "the cluster. The last row is `cis simulate --bundle` as it runs by default (the bundle's validation profile, "
        "Poisson arrivals, the spec's links), for reference; it is not part of the check.\n",
    ]
    views = (*CHECKED_ACCURACY_VIEWS, "sim_bundle_profile")
    md.append(_table(["", *[VIEW_LABELS[k] for k in views]],
                     [["CIS accuracy", *[_pct(c["accuracy"].get(k)) for k in views]]]))
    exits = list(c["served_share"]["calculus"])
    md.append(_table(["served share", *[f"exit {e}" for e in exits]],
                     [[VIEW_LABELS[k], *[_pct(v.get(e)) for e in exits]] for k, v in c["served_share"].items()]))
    md.append(_table(LATENCY_HEADER, [_latency_row("runtime", c["latency"].get("runtime")),
                                      _latency_row("simulator", c["latency"].get("sim"))]))
    md.append(
        f"**Agreement:** offline, runtime and simulator serve the same shares within {100 * agr['share_max_gap']:.1f} "
        f"points and the same accuracy within {100 * agr['accuracy_max_gap']:.1f} points "
        f"(tolerance {100 * agr['share_tolerance']:.0f} points): **{'OK' if agr['ok'] else 'DISAGREE'}**. "
        "The rate calculus is the target the thresholds were calibrated for on the validation split "
        f"(the simulator on that profile is {100 * agr['calculus_gap_bundle_profile']:.1f} points from it); "
        f"on the test samples they drift {100 * agr['calculus_gap']:.1f} points from it: sampling noise of small "
        "splits (a share of n samples has a standard deviation of sqrt(p(1-p)/n), 2.6 points at p = 0.6, n = 359). "
        "The transfer caps bound the drift only once a token bucket (10 s of the cap) is empty.\n"
    )
    cal = c.get("calibration") or {}
    if cal:
        md.append(
            "Cost of a node visit beyond the stages, given to the simulator: "
            f"median {format_ms(cal['visit_cost_median_s'], 3)} ms, mean {format_ms(cal['visit_cost_mean_s'], 3)} ms, "
            f"from a calibration load on the live cluster ({cal['answered']} one-sample Poisson requests at "
            f"{cal['rate']:g}/s, seed {cal['seed']}); each simulated visit draws one of them.\n"
        )
    md += [f"![{name}]({plots[name]})\n" for name in ("served_shares", "latency_cdf") if name in plots]
    t = report.get("timings_s") or {}
    if t:
        md.append("Time per phase (s): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()) + "\n")
    return md


def _run_md(r: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    md = [
        "## Training\n",
        f"`{r['path']}`: {_run_head(r, ' of ')}, {r['train_seconds']:.1f} s of training and evaluation.\n",
    ]
    f = r.get("final")
    if f:
        ea = f.get("exit_accuracy") or {}
        md.append(_table(["test", *[f"exit {e}" for e in ea], "CIS (quota)"],
                         [["accuracy", *[_pct(a) for a in ea.values()], _pct(f.get("cis_accuracy_quota"))]]))
    if "training_curves" in plots:
        md.append(f"![training curves]({plots['training_curves']})\n")
    return md


def _bundle_md(b: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    ver = b["verification"]
    md = [
        "## Bundle\n",
        f"`{b['path']}`: method {b['method']}, created {b['created']}, opset {b['opset']}, "
        f"carries {b['feature_dtype']}; {b['files']}; "
        f"verification max abs diff {ver.get('max_abs_diff')} (passed: {ver.get('passed')}).\n",
    ]
    prof = b["latency_profile_s"]
    batches = [f"ms @ batch {k}" for k in (prof.get("1") or {})]
    md.append(_table(
        ["stage", "exit", "FLOPs", "params", "bytes", "carry B/sample", *batches],
        [[s["index"], s["exit"], s["flops"], s["params"], s["bytes"], s["carry_bytes_per_sample"],
          *[format_ms(v) for v in (prof.get(str(s["index"])) or {}).values()]] for s in b["stages"]],
    ))
    md.append(_table(["node", "exit", "threshold"],
                     [[k, v.get("exit"), v.get("threshold", v.get("patience"))] for k, v in b["nodes"].items()]))
    cal = b.get("calibration") or {}
    if cal:
        md.append(_table(
            ["calibration (validation)", *[f"exit {e}" for e in cal.get("target_share_per_exit", {})]],
            [["target share", *[_pct(v) for v in cal["target_share_per_exit"].values()]],
             ["achieved share", *[_pct(v) for v in cal.get("achieved_share_per_exit", {}).values()]],
             ["exit accuracy", *[_pct(v) for v in cal.get("exit_accuracy", {}).values()]]],
        ))
        md.append(f"CIS accuracy on the {cal.get('samples')} validation samples: {_pct(cal.get('cis_accuracy'))}.\n")
    if "latency_profile" in plots:
        md.append(f"![latency profile]({plots['latency_profile']})\n")
    return md


def _runtime_md(r: Mapping[str, Any]) -> list[str]:
    md = [
        "## Runtime\n",
        f"`{r['path']}`: {r['answered']} of {r['requests']} requests answered in {r.get('wall_s') or 0:.1f} s; "
        f"errors {r['errors'] or 'none'}; degraded {r['degraded']}, capped {r['capped']}; "
        f"accuracy {_pct(r['accuracy'])}.\n",
    ]
    per_node = r.get("served_share_per_node")
    if per_node:
        md.append(_table(["served by", *per_node], [["share", *[_pct(v) for v in per_node.values()]]]))
    return md


def _sim_md(s: Mapping[str, Any], title: str, plots: Mapping[str, str]) -> list[str]:
    config = ", ".join(f"{k} {v}" for k, v in s["config"].items() if v is not None)
    node_keys = ("incoming_rate", "served_rate", "forwarded_rate", "capped_rate", "utilisation")
    md = [
        f"## {title}\n",
        f"`{s['path']}`: requests {_requests(s['requests'])}; accuracy {_pct(s['accuracy'])}, "
        f"drops {_pct(s['drop_share'])}; "
        f"config {config}.\n",
        _table(["exit", "share", "calculus share", "accuracy"],
               [[e, _pct(x["share"]), _pct(x["calculus_share"]), _pct(x["accuracy"])] for e, x in s["exits"].items()]),
        _table(LATENCY_HEADER, [_latency_row("", s["latency"])]),
        _table(["node", "incoming/s", "served/s", "forwarded/s", "capped/s", "utilisation"],
               [[n, *[_num(x.get(k)) for k in node_keys]] for n, x in s["nodes"].items()]),
    ]
    md += [f"![{label}]({plots[name]})\n" for name, label in (("served_shares", "served shares"),
                                                             ("latency_cdf", "latency CDF")) if name in plots]
    return md


def markdown(report: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The report as markdown; ``plots`` maps plot names to paths relative to the markdown file."""
    kind = report["kind"]
    md = [f"# CIS report: {kind} `{report['path']}`\n"]
    if kind == "demo":
        md += _demo_md(report, plots)
    if "run" in report:
        md += _run_md(report["run"], plots)
    if "bundle" in report:
        md += _bundle_md(report["bundle"], plots)
    if "runtime" in report:
        md += _runtime_md(report["runtime"])
    for key, title in (("sim", "Simulator"), ("sim_bundle_profile", "Simulator, bundle profile (reference)")):
        if key in report:
            md += _sim_md(report[key], title, plots if kind == "sim" else {})
    return "\n".join(md)
