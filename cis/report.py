"""One report writer for ``cis report`` and ``cis demo``: a folder in, sections, markdown and plots out.

    report = build_report("runs/d1")          # a run dir, a bundle, a sim dir, a runtime dir or a demo dir
    write_report(report, "report.md")         # report.md + plots/*.png beside it
    print(text_summary(report))

A folder's kind is what it holds: ``manifest.json`` (bundle), ``metrics.jsonl``
or ``checkpoint.json`` (training run), ``result.json`` (``cis simulate --out``),
``summary.json`` + ``requests.csv`` (a demo's runtime replay), ``comparison.json``
(``cis demo``: all of the above in subfolders plus the comparison of the views).
The comparison math is small pure functions (``max_gap``, ``agreement``,
``latency_summary``). numpy only; matplotlib when installed (plots are skipped
with a note otherwise). No torch.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cis.errors import CisError

SHARE_TOLERANCE = 0.03  # served share per exit: views agree within 3 points
ACCURACY_TOLERANCE = 0.03
VIEW_LABELS = {
    "calculus": "rate calculus",
    "offline": "offline (thresholds)",
    "runtime": "runtime",
    "sim": "simulator",
    "sim_bundle_profile": "simulator, bundle profile (ref.)",
}
CHECKED_SHARE_VIEWS = ("calculus", "offline", "runtime", "sim")  # shown
MEASURED_VIEWS = ("offline", "runtime", "sim")  # checked
CHECKED_ACCURACY_VIEWS = ("offline", "runtime", "sim")


# ---------------------------------------------------------------- pure comparison math


def max_gap(views: Mapping[str, Mapping[str, float | None]], names: tuple[str, ...] | None = None) -> float:
    """Largest difference between any two views at any key (exit); views as {name: {key: value}}."""
    names = tuple(n for n in (names or tuple(views)) if n in views)
    gap = 0.0
    for a, b in itertools.combinations(names, 2):
        for k in set(views[a]) | set(views[b]):
            va, vb = views[a].get(k), views[b].get(k)
            if va is None or vb is None:
                return float("inf")
            gap = max(gap, abs(float(va) - float(vb)))
    return gap


def value_gap(values: Mapping[str, float | None], names: tuple[str, ...]) -> float:
    """Largest difference between any two of the named scalar views (inf when one is missing)."""
    got = [values.get(n) for n in names if n in values]
    if any(v is None for v in got) or not got:
        return float("inf")
    return float(max(got) - min(got))


def agreement(comparison: Mapping[str, Any], share_tol: float = SHARE_TOLERANCE, acc_tol: float = ACCURACY_TOLERANCE) -> dict:
    """Do the views agree? The measured views (offline, runtime, simulator) on served shares and
    accuracies, each within its tolerance. The rate calculus is the design target: its gap to the
    measured shares is the thresholds' drift from the validation split they were calibrated on
    to the test samples (reported, with the gap of the simulator on the bundle's own profile)."""
    measured = max_gap(comparison["served_share"], MEASURED_VIEWS)
    acc = value_gap(comparison["accuracy"], CHECKED_ACCURACY_VIEWS)
    return {
        "share_max_gap": measured,
        "calculus_gap": max_gap(comparison["served_share"], ("calculus", "runtime")),
        "calculus_gap_bundle_profile": max_gap(comparison["served_share"], ("calculus", "sim_bundle_profile")),
        "accuracy_max_gap": acc,
        "share_tolerance": share_tol,
        "accuracy_tolerance": acc_tol,
        "ok": bool(measured <= share_tol and acc <= acc_tol),
    }


def latency_summary(seconds: np.ndarray) -> dict:
    """mean, p50, p95, p99 in ms (None when empty)."""
    s = np.asarray(seconds, float)
    s = s[np.isfinite(s)]
    if not len(s):
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(s * 1000, (50, 95, 99))
    return {"count": int(len(s)), "mean": float(s.mean() * 1000), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def relative_gap(a: float | None, b: float | None) -> float | None:
    """|a - b| / b (None when either is missing or b is 0)."""
    if a is None or b is None or b == 0:
        return None
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------- reading folders


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CisError(f"{path}: cannot read ({exc.__class__.__name__}: {exc}); expected a JSON file") from None


def detect_kind(path: Path) -> str:
    if (path / "comparison.json").is_file():
        return "demo"
    if (path / "manifest.json").is_file():
        return "bundle"
    if (path / "metrics.jsonl").is_file() or (path / "checkpoint.json").is_file():
        return "run"
    if (path / "result.json").is_file():
        return "sim"
    if (path / "summary.json").is_file() and (path / "requests.csv").is_file():
        return "runtime"
    raise CisError(
        f"{path}: not a folder cis report knows; expected a run dir (metrics.jsonl), a bundle (manifest.json), "
        "a simulation (result.json) or a demo folder (comparison.json)"
    )


def run_section(path: Path) -> dict:
    """A training run: settings, final accuracies and the per-round curves."""
    config = _json(path / "config.json") if (path / "config.json").is_file() else {}
    summary = _json(path / "summary.json") if (path / "summary.json").is_file() else None
    rows = []
    if (path / "metrics.jsonl").is_file():
        rows = [json.loads(ln) for ln in (path / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    exits = sorted({e for r in rows for e in list(r.get("loss", {})) + list(r.get("val_exit_accuracy", {}))}, key=int)
    curves = {
        "round": [r["round"] for r in rows],
        "loss": {e: [r.get("loss", {}).get(e) for r in rows] for e in exits},
        "val_exit_accuracy": {e: [r.get("val_exit_accuracy", {}).get(e) for r in rows] for e in exits},
        "val_cis_accuracy": [r.get("val_cis_accuracy") for r in rows],
        "seconds": [r.get("seconds") for r in rows],
    }
    out: dict[str, Any] = {
        "path": str(path),
        "dataset": config.get("dataset"),
        "method": config.get("method", "cis"),
        "strategy": config.get("strategy"),
        "rounds": config.get("rounds"),
        "rounds_done": len(rows),
        "train_seconds": float(sum(s or 0.0 for s in curves["seconds"])),
        "curves": curves,
    }
    if summary is not None:
        test = summary.get("test", {})
        out["final"] = {
            "exit_accuracy": test.get("exit_accuracy"),
            "cis_accuracy_quota": test.get("cis_accuracy"),
            "served_share_quota": test.get("served_shares") or test.get("exit_shares"),
            "calibrated": test.get("calibrated"),
            "weights": summary.get("weights"),
        }
    return out


def bundle_section(path: Path) -> dict:
    """A bundle: manifest summary, calibration, verification, profiles (files checked by load_bundle)."""
    from cis.bundle import load_bundle

    m = _json(path / "manifest.json")
    try:
        load_bundle(path)
        verified = "all files match their sha256"
    except CisError as exc:
        verified = f"NOT verified: {exc}"
    latency = {}
    if (path / "profiles" / "latency.json").is_file():
        latency = _json(path / "profiles" / "latency.json").get("stages", {})
    confidence = None
    npz = path / "profiles" / "confidence.npz"
    if npz.is_file():
        with np.load(npz) as z:
            conf, correct = z["confidence"], z["correct"]
        confidence = {
            "samples": int(conf.shape[0]),
            "mean_confidence": {str(e + 1): float(conf[:, e].mean()) for e in range(conf.shape[1])},
            "accuracy": {str(e + 1): float(correct[:, e].mean()) for e in range(conf.shape[1])},
        }
    return {
        "path": str(path),
        "files": verified,
        "method": m.get("method"),
        "created": m.get("created"),
        "dataset": m.get("dataset"),
        "feature_dtype": m.get("feature_dtype"),
        "opset": m.get("opset"),
        "spec": (m.get("spec") or {}).get("cis", {}).get("name") if isinstance(m.get("spec"), dict) else None,
        "stages": [
            {k: s.get(k) for k in ("index", "exit", "flops", "params", "bytes", "carry_bytes_per_sample")} for s in m.get("stages", [])
        ],
        "nodes": m.get("nodes", {}),
        "policy": m.get("policy"),
        "calibration": m.get("calibration"),
        "verification": {k: (m.get("verification") or {}).get(k) for k in ("max_abs_diff", "passed", "atol")},
        "latency_profile_ms": {k: {b: 1000 * float(t) for b, t in v.items()} for k, v in latency.items()},
        "confidence_profile": confidence,
    }


def read_latencies(csv_path: Path, column: str = "latency_s") -> dict[str, np.ndarray]:
    """Latency (s) and exit per request from a requests.csv (simulator or demo runtime)."""
    lat, ex = [], []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get(column) in (None, "") or int(row.get("exit") or 0) <= 0:
                continue
            lat.append(float(row[column]))
            ex.append(int(row["exit"]))
    return {"latency": np.array(lat), "exit": np.array(ex, int)}


def sim_section(path: Path) -> dict:
    r = _json(path / "result.json")
    lat = r.get("latency", {})
    out = {
        "path": str(path),
        "spec": r.get("spec"),
        "requests": r.get("requests"),
        "accuracy": r.get("accuracy"),
        "drop_share": r.get("drop_share"),
        "latency_ms": {k[:-2]: (None if v is None else 1000 * v) for k, v in lat.items() if k.endswith("_s")},
        "exits": {e: {k: x.get(k) for k in ("share", "calculus_share", "rate", "calculus_rate", "accuracy")} for e, x in r.get("exits", {}).items()},
        "nodes": {n: {k: x.get(k) for k in ("incoming_rate", "served_rate", "forwarded_rate", "capped_rate", "utilisation", "dropped")} for n, x in r.get("nodes", {}).items()},
        "config": _sim_config(r.get("config") or {}),
    }
    if (path / "requests.csv").is_file():
        out["latency_ms"].update({k: v for k, v in latency_summary(read_latencies(path / "requests.csv")["latency"]).items() if k == "p95"})
    return out


def _sim_config(c: Mapping[str, Any]) -> dict:
    out = {k: c.get(k) for k in ("arrivals", "requests", "duration", "seed", "service", "loopback", "visit_overhead")}
    rtt = c.get("hop_rtt") or []
    out["hop_rtt_median"] = float(np.median(rtt)) if rtt else None
    return out


def runtime_section(path: Path) -> dict:
    s = _json(path / "summary.json")
    lat = read_latencies(path / "requests.csv")
    return {
        "path": str(path),
        "requests": s.get("requests"),
        "answered": s.get("samples_answered"),
        "errors": s.get("errors"),
        "accuracy": s.get("accuracy"),
        "served_share_per_exit": s.get("served_share_per_exit"),
        "served_share_per_node": s.get("served_share_per_node"),
        "degraded": s.get("degraded"),
        "capped": s.get("capped"),
        "latency_ms": latency_summary(lat["latency"]),
        "wall_s": s.get("wall_s"),
        "calibration": s.get("calibration"),
    }


def build_report(path: str | Path) -> dict:
    """The report of whatever ``path`` holds (see :func:`detect_kind`)."""
    path = Path(path)
    if not path.is_dir():
        raise CisError(f"{path}: not a folder; expected a run dir, a bundle, a simulation folder or a demo folder")
    kind = detect_kind(path)
    report: dict[str, Any] = {"kind": kind, "path": str(path)}
    if kind == "run":
        report["run"] = run_section(path)
    elif kind == "bundle":
        report["bundle"] = bundle_section(path)
    elif kind == "sim":
        report["sim"] = sim_section(path)
    elif kind == "runtime":
        report["runtime"] = runtime_section(path)
    else:
        comparison = _json(path / "comparison.json")
        for name, fn in (("run", run_section), ("bundle", bundle_section), ("runtime", runtime_section), ("sim", sim_section)):
            sub = path / name
            if sub.is_dir():
                report[name] = fn(sub)
        if (path / "sim-bundle" / "result.json").is_file():
            report["sim_bundle_profile"] = sim_section(path / "sim-bundle")
        comparison["latency_ms"] = {
            "runtime": report.get("runtime", {}).get("latency_ms"),
            "sim": report.get("sim", {}).get("latency_ms"),
        }
        comparison["agreement"] = agreement(comparison)
        report["comparison"] = comparison
        report["settings"] = comparison.get("settings")
        report["timings_s"] = comparison.get("timings_s")
    return report


# ---------------------------------------------------------------- writing


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def comparison_lines(c: Mapping[str, Any]) -> list[str]:
    """The short text: accuracy, shares and latency per view."""
    acc, shares, lat, agr = c["accuracy"], c["served_share"], c["latency_ms"], c["agreement"]
    exits = list(shares["calculus"])
    lines = [
        "CIS accuracy:    " + "   ".join(f"{VIEW_LABELS[k].split(' (')[0]} {_pct(acc.get(k))}" for k in CHECKED_ACCURACY_VIEWS),
        "served per exit: " + " ".join(f"{'':>9}exit {e}" for e in exits),
    ]
    for k in (*CHECKED_SHARE_VIEWS, "sim_bundle_profile"):
        if k in shares:
            lines.append(f"  {VIEW_LABELS[k]:<32}" + " ".join(f"{_pct(shares[k].get(e)):>15}" for e in exits))
    rt, sm = lat.get("runtime") or {}, lat.get("sim") or {}
    lines.append(f"latency ms:      runtime p50 {_ms(rt.get('p50'))} p99 {_ms(rt.get('p99'))}   simulator p50 {_ms(sm.get('p50'))} p99 {_ms(sm.get('p99'))}")
    lines.append(
        f"agreement:       offline/runtime/simulator shares within {100 * agr['share_max_gap']:.1f} points, accuracy within {100 * agr['accuracy_max_gap']:.1f} points "
        f"(tolerance {100 * agr['share_tolerance']:.0f}) -> {'OK' if agr['ok'] else 'DISAGREE'}; "
        f"test-set drift from the calculus {100 * agr['calculus_gap']:.1f} points"
    )
    return lines


def text_summary(report: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    kind = report["kind"]
    lines: list[str] = []
    if kind == "demo":
        s = report.get("settings") or {}
        lines.append(f"cis demo: {s.get('dataset')}, {s.get('topology')} {s.get('serving')}, {s.get('rounds')} rounds, {s.get('requests')} requests at {s.get('rate'):g}/s")
        lines += comparison_lines(report["comparison"])
        t = report.get("timings_s") or {}
        if t:
            lines.append("time s:          " + "  ".join(f"{k} {v:.1f}" for k, v in t.items()))
        return "\n".join(lines)
    if "run" in report:
        r = report["run"]
        lines.append(f"run {r['path']}: {r['dataset']}, method {r['method']}, {r['strategy']}, {r['rounds_done']}/{r['rounds']} rounds, {r['train_seconds']:.1f} s")
        if r.get("final"):
            f = r["final"]
            lines.append("test accuracy per exit: " + ", ".join(f"exit {e} {_pct(a)}" for e, a in (f["exit_accuracy"] or {}).items()))
            lines.append(f"CIS accuracy (quota): {_pct(f['cis_accuracy_quota'])}")
    if "bundle" in report:
        b = report["bundle"]
        cal = b.get("calibration") or {}
        lines.append(f"bundle {b['path']}: {len(b['stages'])} stages, carries {b['feature_dtype']}, {b['files']}")
        if cal:
            lines.append("calibrated share per exit: " + ", ".join(f"exit {e} {_pct(s)} (target {_pct(cal['target_share_per_exit'].get(e))})" for e, s in cal.get("achieved_share_per_exit", {}).items()))
            lines.append(f"CIS accuracy on validation: {_pct(cal.get('cis_accuracy'))}")
        lines.append("latency ms/call at batch 1: " + ", ".join(f"stage {k} {_ms(v.get('1'))}" for k, v in b["latency_profile_ms"].items()))
    if "sim" in report:
        s = report["sim"]
        lat = s["latency_ms"]
        lines.append(f"simulation {s['path']}: {s['requests']}, accuracy {_pct(s['accuracy'])}, latency ms mean {_ms(lat.get('mean'))} p50 {_ms(lat.get('p50'))} p99 {_ms(lat.get('p99'))}")
        lines.append("served per exit: " + ", ".join(f"exit {e} {_pct(x['share'])} (calculus {_pct(x['calculus_share'])})" for e, x in s["exits"].items()))
    if "runtime" in report:
        r = report["runtime"]
        lat = r["latency_ms"]
        lines.append(f"runtime {r['path']}: {r['answered']} of {r['requests']} answered, accuracy {_pct(r['accuracy'])}, latency ms p50 {_ms(lat['p50'])} p99 {_ms(lat['p99'])}")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def markdown(report: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The report as markdown; ``plots`` maps plot names to paths relative to the markdown file."""
    md: list[str] = []
    kind = report["kind"]
    md.append(f"# CIS report: {'demo' if kind == 'demo' else kind} `{report['path']}`\n")
    if kind == "demo":
        s = report.get("settings") or {}
        md.append(
            f"{s.get('dataset')}, topology {s.get('topology')}, serving {s.get('serving')}, {s.get('strategy')} weights, "
            f"{s.get('rounds')} rounds; {s.get('requests')} test requests at {s.get('rate'):g} requests/s, seed {s.get('seed')}.\n"
        )
        c = report["comparison"]
        agr = c["agreement"]
        md.append("## The three views\n")
        md.append(
            "Offline: the bundle's graphs on the test samples with the threshold policy (`evaluate_cis(policy=bundle.policy)`). "
            "Runtime: the same samples sent through the leaves (`assign_entries`) to the node processes. "
            "Simulator: the same samples, entry nodes and send times in SimPy, with the per-visit cost calibrated on the cluster. "
            "The last row is `cis simulate --bundle` as it runs by default (the bundle's validation profile, Poisson arrivals, "
            "the spec's links), for reference; it is not part of the check.\n"
        )
        md.append(_table(["", *[VIEW_LABELS[k] for k in CHECKED_ACCURACY_VIEWS], VIEW_LABELS["sim_bundle_profile"]],
                         [["CIS accuracy", *[_pct(c["accuracy"].get(k)) for k in (*CHECKED_ACCURACY_VIEWS, "sim_bundle_profile")]]]) + "\n")
        exits = list(c["served_share"]["calculus"])
        md.append(_table(["served share", *[f"exit {e}" for e in exits]],
                         [[VIEW_LABELS[k], *[_pct(v.get(e)) for e in exits]] for k, v in c["served_share"].items()]) + "\n")
        rt, sm = c["latency_ms"].get("runtime") or {}, c["latency_ms"].get("sim") or {}
        md.append(_table(["latency (ms)", "mean", "p50", "p95", "p99"],
                         [["runtime", *[_ms(rt.get(k)) for k in ("mean", "p50", "p95", "p99")]],
                          ["simulator", *[_ms(sm.get(k)) for k in ("mean", "p50", "p95", "p99")]]]) + "\n")
        md.append(
            f"**Agreement:** offline, runtime and simulator serve the same shares within {100 * agr['share_max_gap']:.1f} points and "
            f"the same accuracy within {100 * agr['accuracy_max_gap']:.1f} points (tolerance {100 * agr['share_tolerance']:.0f} points): "
            f"**{'OK' if agr['ok'] else 'DISAGREE'}**. The rate calculus is the target the thresholds were calibrated for on the validation split "
            f"(the simulator on that profile is {100 * agr['calculus_gap_bundle_profile']:.1f} points from it); on the test samples they drift "
            f"{100 * agr['calculus_gap']:.1f} points from it: sampling noise of small splits (a share of n samples has a standard deviation of "
            f"sqrt(p(1-p)/n), 2.6 points at p = 0.6, n = 359). The transfer caps bound the drift only once a token bucket (10 s of the cap) is empty.\n"
        )
        cal = c.get("calibration") or {}
        if cal:
            md.append(
                f"Cost of a node visit beyond the stages, given to the simulator: median {1000 * cal['visit_cost_median_s']:.3f} ms, "
                f"mean {1000 * cal['visit_cost_mean_s']:.3f} ms, from a calibration load on the live cluster ({cal['answered']} one-sample "
                f"Poisson requests at {cal['rate']:g}/s, seed {cal['seed']}); each simulated visit draws one of them.\n"
            )
        for name in ("served_shares", "latency_cdf"):
            if name in plots:
                md.append(f"![{name}]({plots[name]})\n")
        t = report.get("timings_s") or {}
        if t:
            md.append("Time per phase (s): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()) + "\n")
    if "run" in report:
        r = report["run"]
        md.append("## Training\n")
        md.append(f"`{r['path']}`: {r['dataset']}, method {r['method']}, strategy {r['strategy']}, {r['rounds_done']} of {r['rounds']} rounds, {r['train_seconds']:.1f} s of training and evaluation.\n")
        f = r.get("final")
        if f:
            ea = f.get("exit_accuracy") or {}
            md.append(_table(["test", *[f"exit {e}" for e in ea], "CIS (quota)"], [["accuracy", *[_pct(a) for a in ea.values()], _pct(f.get("cis_accuracy_quota"))]]) + "\n")
        if "training_curves" in plots:
            md.append(f"![training curves]({plots['training_curves']})\n")
    if "bundle" in report:
        b = report["bundle"]
        md.append("## Bundle\n")
        md.append(f"`{b['path']}`: method {b['method']}, created {b['created']}, opset {b['opset']}, carries {b['feature_dtype']}; {b['files']}; "
                  f"verification max abs diff {b['verification'].get('max_abs_diff')} (passed: {b['verification'].get('passed')}).\n")
        md.append(_table(["stage", "exit", "FLOPs", "params", "bytes", "carry B/sample", *[f"ms @ batch {k}" for k in (b["latency_profile_ms"].get("1") or {})]],
                         [[s["index"], s["exit"], s["flops"], s["params"], s["bytes"], s["carry_bytes_per_sample"],
                           *[_ms(v) for v in (b["latency_profile_ms"].get(str(s["index"])) or {}).values()]] for s in b["stages"]]) + "\n")
        md.append(_table(["node", "exit", "threshold"], [[k, v.get("exit"), v.get("threshold", v.get("patience"))] for k, v in b["nodes"].items()]) + "\n")
        cal = b.get("calibration") or {}
        if cal:
            md.append(_table(["calibration (validation)", *[f"exit {e}" for e in cal.get("target_share_per_exit", {})]],
                             [["target share", *[_pct(v) for v in cal["target_share_per_exit"].values()]],
                              ["achieved share", *[_pct(v) for v in cal.get("achieved_share_per_exit", {}).values()]],
                              ["exit accuracy", *[_pct(v) for v in cal.get("exit_accuracy", {}).values()]]]) + "\n")
            md.append(f"CIS accuracy on the {cal.get('samples')} validation samples: {_pct(cal.get('cis_accuracy'))}.\n")
        if "latency_profile" in plots:
            md.append(f"![latency profile]({plots['latency_profile']})\n")
    if "runtime" in report:
        r = report["runtime"]
        md.append("## Runtime\n")
        md.append(f"`{r['path']}`: {r['answered']} of {r['requests']} requests answered in {r.get('wall_s') or 0:.1f} s; errors {r['errors'] or 'none'}; "
                  f"degraded {r['degraded']}, capped {r['capped']}; accuracy {_pct(r['accuracy'])}.\n")
        if r.get("served_share_per_node"):
            md.append(_table(["served by", *r["served_share_per_node"]], [["share", *[_pct(v) for v in r["served_share_per_node"].values()]]]) + "\n")
    for key, title in (("sim", "Simulator"), ("sim_bundle_profile", "Simulator, bundle profile (reference)")):
        if key in report:
            s = report[key]
            lat = s["latency_ms"]
            md.append(f"## {title}\n")
            md.append(f"`{s['path']}`: requests {s['requests']}, accuracy {_pct(s['accuracy'])}, drops {_pct(s['drop_share'])}; "
                      f"config {', '.join(f'{k} {v}' for k, v in s['config'].items() if v is not None)}.\n")
            md.append(_table(["exit", "share", "calculus share", "accuracy"], [[e, _pct(x["share"]), _pct(x["calculus_share"]), _pct(x["accuracy"])] for e, x in s["exits"].items()]) + "\n")
            md.append(_table(["latency (ms)", "mean", "p50", "p95", "p99"], [["", *[_ms(lat.get(k)) for k in ("mean", "p50", "p95", "p99")]]]) + "\n")
            md.append(_table(["node", "incoming/s", "served/s", "forwarded/s", "capped/s", "utilisation"],
                             [[n, *[_ms(x.get(k)) for k in ("incoming_rate", "served_rate", "forwarded_rate", "capped_rate", "utilisation")]] for n, x in s["nodes"].items()]) + "\n")
            if kind == "sim" and "served_shares" in plots:
                md.append(f"![served shares]({plots['served_shares']})\n")
            if kind == "sim" and "latency_cdf" in plots:
                md.append(f"![latency CDF]({plots['latency_cdf']})\n")
    return "\n".join(md)


def write_plots(report: Mapping[str, Any], folder: Path) -> tuple[dict[str, Path], list[str]]:
    """training_curves.png, served_shares.png, latency_cdf.png, latency_profile.png (those that apply)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, ["matplotlib is not installed (pip install 'cis[plot]'); plots skipped"]
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=110)
        plt.close(fig)
        made[name] = folder / f"{name}.png"

    run = report.get("run")
    if run and run["curves"]["round"]:
        c = run["curves"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
        for e, v in c["val_exit_accuracy"].items():
            a1.plot(c["round"], [np.nan if x is None else 100 * x for x in v], marker=".", label=f"exit {e}")
        if any(x is not None for x in c["val_cis_accuracy"]):
            a1.plot(c["round"], [np.nan if x is None else 100 * x for x in c["val_cis_accuracy"]], "k--", label="CIS (quota)")
        a1.set(xlabel="round", ylabel="validation accuracy (%)", title="accuracy per exit")
        for e, v in c["loss"].items():
            a2.plot(c["round"], [np.nan if x is None else x for x in v], marker=".", label=f"exit {e}")
        a2.set(xlabel="round", ylabel="training loss", title="loss per exit")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
        save(fig, "training_curves")

    views: dict[str, Mapping[str, float]] = {}
    if report.get("comparison"):
        views = report["comparison"]["served_share"]
    elif report.get("sim"):
        ex = report["sim"]["exits"]
        views = {"calculus": {e: x["calculus_share"] for e, x in ex.items()}, "sim": {e: x["share"] for e, x in ex.items()}}
    elif report.get("bundle") and report["bundle"].get("calibration"):
        cal = report["bundle"]["calibration"]
        views = {"calculus": cal["target_share_per_exit"], "offline": cal["achieved_share_per_exit"]}
    if views:
        exits = list(next(iter(views.values())))
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        w = 0.8 / len(views)
        for k, (name, v) in enumerate(views.items()):
            ax.bar(np.arange(len(exits)) + (k - (len(views) - 1) / 2) * w, [100 * (v.get(e) or 0) for e in exits], w, label=VIEW_LABELS.get(name, name))
        ax.set_xticks(range(len(exits)), [f"exit {e}" for e in exits])
        ax.set(ylabel="served share (%)", title="served share per exit")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        save(fig, "served_shares")

    curves = []
    if report.get("runtime"):
        curves.append(("runtime", read_latencies(Path(report["runtime"]["path"]) / "requests.csv")))
    if report.get("sim") and (Path(report["sim"]["path"]) / "requests.csv").is_file():
        curves.append(("simulator", read_latencies(Path(report["sim"]["path"]) / "requests.csv")))
    if curves:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for (name, d), color in zip(curves, ("C0", "C1")):
            lat = np.sort(d["latency"]) * 1000
            if len(lat):
                ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), color=color, lw=2, label=f"{name}, all")
            for e, style in zip(sorted(set(d["exit"].tolist())), (":", "--", "-.", ":")):
                le = np.sort(d["latency"][d["exit"] == e]) * 1000
                ax.plot(le, np.arange(1, len(le) + 1) / len(le), color=color, ls=style, lw=1, label=f"{name}, exit {e}")
        ax.set_xscale("log")
        ax.set(xlabel="end-to-end latency (ms, log)", ylabel="fraction of requests", title="latency CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "latency_cdf")

    b = report.get("bundle")
    if b and b.get("latency_profile_ms"):
        prof = b["latency_profile_ms"]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for k, v in prof.items():
            ax.plot([int(x) for x in v], list(v.values()), marker="o", label=f"stage {k}")
        ax.set(xlabel="batch size", ylabel="ms per call (onnxruntime)", title="latency profile")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "latency_profile")
    return made, []


def write_report(report: dict, md_path: str | Path) -> list[str]:
    """Write the markdown to ``md_path`` and its plots to ``plots/`` beside it; returns notes."""
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    made, notes = write_plots(report, md_path.parent / "plots")
    rel = {k: str(p.relative_to(md_path.parent)) for k, p in made.items()}
    report["plots"] = {k: str(p) for k, p in made.items()}
    text = markdown(report, rel) + "".join(f"\n_note: {n}_\n" for n in notes)
    md_path.write_text(text)
    return notes
