"""The twin against the runtime span by span (issue 36): where, near capacity, the simulator and the runtime part.

    python -m bench.twin_spans --pause-cwd /work/wt/campaign      # every case, full loads
    python -m bench.twin_spans --cases loopback --levels 0.8
    python -m bench.twin_spans --quick                            # smoke run: short loads, 1 twin seed

Each case runs a real cluster whose nodes write their spans (queue, compute, forward, request: ``cis serve
--spans-file``, docs/runtime.md *Tracing*; cis/sim/spans.py reads them), calibrates the twin
once at a light load exactly as bench/twin_hard.py does, then sends loads; the twin replays each load
(at the same entry nodes, at the times they admitted the requests, so that the load generator's own delays are
kept (``--intended-times``: at the times it meant to send them), the same samples, so the same exits:
``sim_vs_runtime``'s replay) with its per-visit spans on. Per node and kind the two distributions are set side
by side (per sample: a runtime message between nodes that carried k samples counts k times), with the twin's
signed error per statistic; the queue and compute spans are ranked by what their gap adds to a request's mean
latency, and what is left of the mean's gap is messaging (everything outside the nodes' queues and batches).

Cases (``--cases``):

- ``loopback``: twin_hard's bottleneck (a cloud with a wide stage on a core of its own behind two devices
  that forward everything, device0 capped), at utilisation ``--levels`` (default 0.5, 0.8, 0.9);
- ``link``: twin_hard's links regime, paper-7 on the testbed, fp32 carries, every link at 20 Mbit/s, 40
  requests/s (root, namespaces);
- ``colocated``: the same testbed and load with the spec's hosts: the devices and edges on a 1-core host,
  the cloud on another (``cis testbed`` pins them with taskset), the twin sharing the cores.

Writes bench/results/twin_spans.{json,md} and the CDFs, one figure per case and level, under
bench/results/twin_spans/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.doc_marks import write_doc_block
from bench.harness import REPO, RESULTS, drive_load, load_now, machine, paused, say
from bench.spans import compare, parting, per_kind, plot_cdfs, replay_files, sent_profile, with_answers
from bench.twin_bundles import wide_cloud_bundle
from bench.twin_hard import (
    CAP_SHARE,
    LOOPBACK_CALIBRATION,
    Bed,
    Bench,
    bottleneck_inputs,
    bottleneck_spec,
    cloud_capacity,
    colocated_spec,
    load_record,
    ms,
    rate_for,
    run_text,
    session_priority,
    sim_links_spec,
    testbed_spec,
    twin_config,
    with_interference,
    with_message_work,
    work_text,
)
from cis.sim.twin_batches import batch_overheads, interference, stage_speed
from cis.sim.twin_calibration import calibrate, summarise_runtime, summarise_sim
from cis.sim.twin_stages import beside_busy_core, message_work, profile_stages, spread

LEVELS = (0.5, 0.8, 0.9)


def twin_replay(spec, config, bundle, profile, load: dict, work: Path, seeds: int, name: str) -> tuple[dict, dict]:
    """The twin on the load's own arrivals, entries and samples: its request log and span columns, pooled."""
    from cis.sim import simulate
    from cis.sim.spans import span_columns, span_records

    trace = work / f"trace-{name}.csv"
    rows = replay_files(trace, load["times"], load["entries"], profile.samples)
    config = replace(config, arrivals="trace", trace=str(trace), duration=float(load["times"].max()) + 1e-6,
                     spans=True)
    logs, cols = [], []
    for seed in range(seeds):
        result = simulate(spec, replace(config, seed=seed), bundle, profile=profile, rows=rows)
        logs.append(result.requests)
        cols.append(span_columns(span_records(result.spans, spec.ids, {n.id: n.parent for n in spec.nodes})))
    pooled = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
    return {k: np.concatenate([log[k] for log in logs]) for k in logs[0]}, pooled


def compare_load(args, name: str, spec, rt_cols, tw_cols, rt_figs: dict, tw_req: dict, window: tuple, wall: float,
                 seeds: int) -> dict:
    """One load: end to end, per span, where they part; the CDF figure."""
    tw_figs = summarise_sim(tw_req, spec.num_exits, window)
    rt_window = (wall + window[0], wall + window[1])
    runtime, twin = per_kind(with_answers(rt_cols), rt_window, True), per_kind(tw_cols, window, True)
    answered = {"runtime": rt_figs["answered"], "twin": tw_figs["answered"] / seeds}
    twin = {n: {k: v | {"count": v["count"] / seeds} for k, v in kinds.items()} for n, kinds in twin.items()}
    spans = compare(runtime, twin, answered)
    end = {"runtime": rt_figs["latency"], "twin": tw_figs["latency"]}
    figure = RESULTS / "twin_spans" / f"{name}.png"
    drawn = plot_cdfs(figure, with_answers(rt_cols), tw_cols, rt_window, window,
                      f"{name}: runtime (solid) vs twin (dashed)")
    return {
        "end_to_end": end | {"error": {k: _rel(end["twin"][k], end["runtime"][k]) for k in end["runtime"]}},
        "answered": answered,
        "shares": {"runtime": rt_figs["shares"], "twin": tw_figs["shares"]},
        "spans": spans,
        "parting": parting(spans, end),
        "figure": str(figure.relative_to(RESULTS.parent.parent)) if drawn else None,
    }


def _field(text: str):
    value = json.loads(text)
    return tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(value, list) else value


def _rel(a, b):
    return None if a is None or b is None or b == 0 else (a - b) / b


# ---------------------------------------------------------------- cases


def loopback_case(args, work: Path) -> dict:
    """twin_hard's bottleneck cluster with spans on: calibration, then the loads at each level; the twin
    replays them. With ``--from-spans`` the runtime's files of an earlier run are compared again."""
    spans_dir = work / "spans-loopback"
    if not args.from_spans:
        loopback_runtime(args, work, spans_dir)
    return replay_case(args, work, spans_dir, "loopback", loopback_twin)


def loopback_runtime(args, work: Path, spans_dir: Path) -> None:
    """Run the cluster: calibrate once at a light load, then each level's load; keep spans and case.json."""
    bdir = wide_cloud_bundle(work, args.cifar)
    with paused(args.pause_cwd):
        profile = profile_stages(bdir, {1: 0, 2: 1, 3: 1}, bottleneck_inputs())
        scatter = spread(bdir, 3, 1, bottleneck_inputs())
        beside = beside_busy_core(bdir, 3, 1, 1, 0, bottleneck_inputs())
        probe = message_work(bdir, 3, 2, 1, 0, bottleneck_inputs())
    stages_mu = 32 / (profile[2][32] + profile[3][32])
    cap, light = CAP_SHARE * stages_mu, 0.15 * stages_mu
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # the load generator beside the devices, off the cloud's core
    bench = Bench(args, work, bdir, bottleneck_spec(light, cap), "spans", spans_dir=spans_dir)
    loads = []
    try:
        with paused(args.pause_cwd):
            wall = time.time()
            cal = calibrate(bench.cluster.addresses, bench.x, bench.spec, {k: profile[k][1] for k in profile},
                            light, LOOPBACK_CALIBRATION * args.calibration, 999, spans=bench.spans,
                            profile=profile)
            cal["window"] = [wall, time.time()]
        cal["service_spread"] = scatter
        with_interference(cal, beside)
        with_message_work(cal, probe)
        mu = cloud_capacity(profile, cal)
        say(f"loopback: calibrated (node work {work_text(cal)}), capacity {mu:.1f}/s")
        for rho in args.levels:
            rate = rate_for(rho, mu, cap)
            figs, busy = bench.measure(rate, 100 + int(rho * 10))
            loads.append({"rho": rho, "rate": rate, "figs": figs, "busy": busy, "load": bench.last})
            say(f"loopback rho {rho}: runtime p50 {ms(figs['latency']['p50'])} ms, p95 {ms(figs['latency']['p95'])}")
    finally:
        bench.stop()
        os.sched_setaffinity(0, cores)
    keep_case(spans_dir, {"bundle": str(bdir), "cap": cap, "capacity_rps": mu, "calibration": cal,
                          "profile": profile, "x_seed": 0, "warmup": args.warmup, "seconds": args.seconds}, loads)


def testbed_case(args, work: Path, name: str, spec, bandwidth: float | None) -> dict:
    """paper-7 on the testbed (fp32 carries) with spans on: calibrated once at a light load on unshaped links,
    then one load at ``--link-rate`` (link) or ``--colocated-rate`` (colocated) on links of ``bandwidth`` (None:
    the spec's own); the twin replays it on the same links (TCP segments, tbf's burst)."""
    spans_dir = work / f"spans-{name}"
    if not args.from_spans:
        testbed_runtime(args, work, name, spec, bandwidth, spans_dir)
    return replay_case(args, work, spans_dir, name, testbed_twin)


def testbed_runtime(args, work: Path, name: str, spec, bandwidth: float | None, spans_dir: Path) -> None:
    from cis.core.spec import spec_to_dict

    rate = sum(n.arrival_rate for n in spec.nodes)
    bed = Bed(args, work, "fp32", spec, spans_dir)
    try:
        profile, cal = bed.calibrate()
        for child in bed.bed.plan.links:
            bed.bed.set_bandwidth(child, bandwidth if bandwidth is not None else spec.node(child).link.bandwidth)
        with paused(args.pause_cwd):
            wall = time.time()
            load = drive_load(bed.bed.addresses, bed.x, rate, spec=spec, seconds=args.warmup + args.seconds, seed=700)
            busy = load_now()
        time.sleep(1.0)
        figs = summarise_runtime(load, spec.num_exits, (args.warmup, args.warmup + args.seconds))
        say(f"{name}: runtime p50 {ms(figs['latency']['p50'])} ms, p95 {ms(figs['latency']['p95'])}")
        netem, cores = bed.bed.netem, bed.bed.cores
    finally:
        bed.stop()
    keep_case(spans_dir, {"bundle": str(bed.bdir), "calibration": cal, "profile": profile, "x_seed": 0,
                          "x_shape": list(bed.x.shape), "warmup": args.warmup, "seconds": args.seconds,
                          "spec": spec_to_dict(spec), "netem": netem, "cores": cores},
              [{"label": f"{rate:g}rps", "rate": rate, "figs": figs, "busy": busy, "load": load_record(load, wall)}])


def testbed_twin(case: dict, load: dict):
    """The case's spec on the links the testbed had (no propagation latency without netem) and the twin's
    config: TCP segments and tbf's burst on every link."""
    from cis.core.spec import parse_spec

    spec = sim_links_spec(parse_spec(case["spec"], "case.json"), case["netem"])
    config = twin_config(case["calibration"], case["profile"], duration=1.0, wire="tcp", link_burst=1600.0,
                         threshold=math.inf)
    return spec, config


def loopback_twin(case: dict, load: dict):
    """The bottleneck's spec at the load's rate, and the twin's config from the calibration."""
    spec = bottleneck_spec(load["rate"], case["cap"])
    return spec, twin_config(case["calibration"], case["profile"], duration=1.0, loopback=True, threshold=math.inf)


def replay_case(args, work: Path, spans_dir: Path, name: str, twin_of) -> dict:
    """Compare a case's runtime spans (``spans_dir``) with the twin replaying each of its loads."""
    from cis.core.bundle import load_bundle
    from cis.sim.spans import read_spans

    case = json.loads((spans_dir / "case.json").read_text())
    case["profile"] = {int(k): {int(b): t for b, t in v.items()} for k, v in case["profile"].items()}
    bundle = load_bundle(case["bundle"])
    rt_cols = read_spans(sorted(spans_dir.glob("*.spans.jsonl")))
    x = case_inputs(case)
    sent = sent_profile(Path(case["bundle"]), x)
    window = (case["warmup"], case["warmup"] + case["seconds"])
    cal = case["calibration"]
    if "window" in cal:  # the node work per batch, from the calibration load's spans (again: the same numbers)
        spec0 = twin_of(case, {**case["loads"][0], "times": [], "entries": {}})[0]
        cal["batch_overhead_s"] = batch_overheads(rt_cols, case["profile"], spec0, tuple(cal["window"]))[0]
        if "interference_ratios" not in cal:  # measured in-process, not from the spans
            cal["interference"] = interference(rt_cols, case["profile"], spec0, tuple(cal["window"]))["interference"]
    points = []
    for load in case["loads"]:
        load["times"] = np.asarray(load["times"])
        load["entries"] = {k: np.asarray(v, int) for k, v in load["entries"].items()}
        late = None if args.intended_times else sent_late(rt_cols, load)
        if late is not None:
            load["times"], load["late"] = late
        spec, config = twin_of(case, load)
        config = replace(config, **args.twin_set)
        label = f"{name}-{load['label']}"
        req, cols = twin_replay(spec, config, bundle, sent, load, work, args.sim_seeds, label)
        point = compare_load(args, label, spec, rt_cols, cols, load["figs"], req, window, load["wall"],
                             args.sim_seeds)
        point["stage_speed"] = stage_speed(rt_cols, case["profile"], spec,
                                           (load["wall"] + window[0], load["wall"] + window[1]))
        points.append({k: load[k] for k in ("label", "rho", "rate", "busy", "late") if k in load} | point)
    return {k: v for k, v in case.items() if k not in ("loads",)} | {"points": points}


def sent_late(rt_cols: dict, load: dict) -> tuple[np.ndarray, dict] | None:
    """The load's arrivals as its entry nodes admitted them, and how late they came.

    The load generator sends each request at its intended time when it can; a generator that falls behind (its
    own CPU, the devices' beside it on one core) sends the ones it owes in a burst, which the runtime serves and
    a replay of the intended times never sees. The k-th request an entry node admitted after the load began is
    its k-th intended one (one client per entry, in order); its lateness is the admission's delay beyond the
    load's median delay (the clients' start and messaging are the same for all). None when the spans do not
    hold every request of the load."""
    times = load["times"].copy()
    late = []
    for nid, idx in load["entries"].items():
        idx = np.sort(idx)
        mine = (rt_cols["node"] == nid) & (rt_cols["kind"] == "request") & (rt_cols["start"] >= load["wall"])
        got = np.sort(rt_cols["start"][mine])[: len(idx)]
        if len(got) < len(idx):
            return None
        delay = got - (load["wall"] + times[idx])
        times[idx] += delay - np.median(delay)
        late.append(delay - np.median(delay))
    behind = np.concatenate(late)
    return times, {"p50_ms": 1e3 * float(np.median(behind)), "p99_ms": 1e3 * float(np.percentile(behind, 99)),
                   "max_ms": 1e3 * float(behind.max()), "over_10ms": float(np.mean(behind > 0.010))}


def case_inputs(case: dict) -> np.ndarray:
    """The samples the case's loads sent (twin_hard's Bench and testbed inputs, by their seed and shape)."""
    shape = tuple(case.get("x_shape", (256, 3, 32, 32)))
    return np.random.default_rng(case.get("x_seed", 0)).standard_normal(shape).astype(np.float32)


def keep_case(spans_dir: Path, case: dict, loads: list[dict]) -> None:
    """What the twin replays, beside the runtime's spans (case.json): calibration, stage profile, each load's
    arrivals, entries, start and the runtime's figures, so a model change can be tried again offline."""
    case = case | {"loads": [
        {"label": e["label"] if "label" in e else f"{e['rho']:g}", "rho": e.get("rho"), "rate": e["rate"],
         "figs": e["figs"],
         "busy": e.get("busy"), "wall": e["load"]["wall"], "times": e["load"]["times"].tolist(),
         "entries": {k: v.tolist() for k, v in e["load"]["entries"].items()}, "latency": e["load"]["latency"]}
        for e in loads]}
    (spans_dir / "case.json").write_text(json.dumps(case, default=float))


# ---------------------------------------------------------------- report


def describe(point: dict) -> str:
    """One sentence: the end-to-end gap and the span that holds it."""
    e, p = point["end_to_end"], point["parting"]
    big = p["largest"]
    text = (f"p50/p95/p99 twin {' / '.join(ms(e['twin'][k]) for k in ('p50', 'p95', 'p99'))} ms against "
            f"{' / '.join(ms(e['runtime'][k]) for k in ('p50', 'p95', 'p99'))} "
            f"({' / '.join(_pct(e['error'][k]) for k in ('p50', 'p95', 'p99'))}); mean gap {p['mean_gap_ms']:+.2f} ms")
    if big is not None:
        text += (f", of which {big['node']}'s {big['kind']} span {big['gap_ms']:+.2f} ms per request (its p95 "
                 f"{_pct(big['error']['p95'])}), outside the queue and compute spans {p['messaging_gap_ms']:+.2f} ms")
    if point.get("stage_speed"):
        text += "; the runtime's stages against their profile (median per batch): " + ", ".join(
            f"{node} x{v:.2f}" for node, v in point["stage_speed"].items())
    return text


def _pct(v):
    return "-" if v is None else f"{100 * v:+.0f} %"


def markdown(result: dict) -> str:
    lines = ["# The twin against the runtime, span by span (issue 36)", "",
             f"{runs_text(result)}. Runtime spans from the nodes, the twin's from the simulator replaying the same "
             f"arrivals and samples ({result['config']['sim_seeds']} seeds pooled); per sample; errors are "
             "(twin - runtime) / runtime.", ""]
    for case, data in result["cases"].items():
        for point in data["points"]:
            title = f"{case} at utilisation {point['rho']:g}" if point.get("rho") else f"{case} at {point['label']}"
            lines += [f"## {title}", "", describe(point) + ".", ""]
            if point.get("late"):
                lt = point["late"]
                lines += [f"Replayed at the times the entry nodes admitted the requests: the load generator sent "
                          f"them late by {lt['p99_ms']:.1f} ms at p99 and {lt['max_ms']:.1f} ms at most beyond its "
                          f"median delay ({100 * lt['over_10ms']:.1f} % over 10 ms).", ""]
            lines += [
                      "| node | span | n rt / twin | mean ms rt / twin | p50 | p95 | p99 | batch rt / twin | "
                      "error mean / p95 |", "|---|---|---|---|---|---|---|---|---|"]
            for node, kinds in point["spans"].items():
                for kind, e in kinds.items():
                    rt, tw = e.get("runtime") or {}, e.get("twin") or {}
                    err = e.get("error") or {}

                    def pair(k, rt=rt, tw=tw):
                        return f"{ms(rt.get(k))} / {ms(tw.get(k))}"

                    batch = (f"{rt['mean_batch']:.1f} / {tw['mean_batch']:.1f}"
                             if "mean_batch" in rt and "mean_batch" in tw else "")
                    lines.append(f"| {node} | {kind} | {rt.get('count', 0):.0f} / {tw.get('count', 0):.0f} | "
                                 f"{pair('mean')} | {pair('p50')} | {pair('p95')} | {pair('p99')} | {batch} | "
                                 f"{_pct(err.get('mean'))} / {_pct(err.get('p95'))} |")
            if point.get("figure"):
                lines += ["", f"CDFs: {point['figure']}"]
            lines.append("")
    return "\n".join(lines) + "\n"


def how_close(result: dict) -> str:
    """docs/simulator.md's span-by-span figures, from the result: per case and load, the end-to-end errors and
    the span that holds the gap."""
    lines = [f"From bench/results/twin_spans.json ({runs_text(result)}).", ""]
    for case, data in result["cases"].items():
        for point in data["points"]:
            where = f"utilisation {point['rho']:g}" if point.get("rho") else point["label"]
            lines.append(f"- {case} at {where}: {describe(point)}.")
    return "\n".join(lines)


def case_runs(result: dict) -> dict:
    """{case: {"command", "machine"}}: the run that made each case (the result's own where a case names none)."""
    top = {"command": result["command"], "machine": result["machine"]}
    return {case: data.get("run", top) for case, data in result["cases"].items()}


def runs_text(result: dict) -> str:
    """Which command made which cases, on what machine, at what load."""
    by_run: dict[str, list[str]] = {}
    runs = {}
    for case, run in case_runs(result).items():
        by_run.setdefault(run["command"], []).append(case)
        runs[run["command"]] = run
    return "; ".join(f"{', '.join(cases)}: {run_text(runs[cmd])}" for cmd, cases in by_run.items())


def merged(old: dict, new: dict) -> dict:
    """``--update``: the earlier result's cases, each with the run that made it, and the cases just run in place
    of their own."""
    cases = {case: {**data, "run": data.get("run", run)} for (case, data), run in
             zip(old["cases"].items(), case_runs(old).values())}
    return {**new, "cases": {**cases, **new["cases"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="loopback,link,colocated")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="loopback: utilisations (default 0.5,0.8,0.9)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--calibration", type=int, default=300)
    ap.add_argument("--sim-seeds", type=int, default=3)
    ap.add_argument("--link-rate", type=float, default=40.0, help="link: requests/s in total (default 40)")
    ap.add_argument("--colocated-rate", type=float, default=300.0, help="colocated: requests/s in total (default 300)")
    ap.add_argument("--slo-p99", type=float, default=100.0, help=argparse.SUPPRESS)
    ap.add_argument("--pause-cwd", action="append", default=[], metavar="PATH")
    ap.add_argument("--priority", type=int, default=-15)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "twin-hard"))
    ap.add_argument("--cifar", default="/tmp/cifar10")
    ap.add_argument("--from-spans", action="store_true",
                    help="compare the runtime spans of the last run (under --work) again, without running the runtime")
    ap.add_argument("--twin-set", action="append", default=[], metavar="FIELD=JSON",
                    help="replace a SimConfig field of the twin (e.g. hop_rtt=[0.0002]): try a model change offline")
    ap.add_argument("--intended-times", action="store_true",
                    help="replay the loads at their intended send times, not at the times the entry nodes admitted "
                    "them (which keep the load generator's own delays)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 s loads after 2 s, 1 twin seed")
    ap.add_argument("--update", action="store_true",
                    help="keep the other cases of the last result (--out's json): run cases in separate windows")
    ap.add_argument("--out", default=str(RESULTS / "twin_spans"))
    args = ap.parse_args()
    args.levels = tuple(float(v) for v in args.levels.split(","))
    args.twin_set = {k: _field(v) for k, v in (item.split("=", 1) for item in args.twin_set)}
    if args.quick:
        args.seconds, args.warmup, args.sim_seeds, args.calibration = 4.0, 2.0, 1, 120
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict = {"command": "python -m bench.twin_spans " + " ".join(sys.argv[1:]), "machine": machine(),
                    "config": {k: v for k, v in vars(args).items() if k != "out"}, "cases": {}}
    with session_priority(args.priority):
        if "loopback" in cases:
            result["cases"]["loopback"] = loopback_case(args, work)
        if "link" in cases:
            result["cases"]["link"] = testbed_case(args, work, "link", testbed_spec(2_500_000.0, args.link_rate),
                                                   2_500_000.0)
        if "colocated" in cases:
            result["cases"]["colocated"] = testbed_case(args, work, "colocated", colocated_spec(args.colocated_rate),
                                                        None)
    result["seconds"] = time.perf_counter() - t0
    result["load_now"] = load_now()
    for data in result["cases"].values():
        data["run"] = {"command": result["command"], "machine": result["machine"]}
    out = Path(args.out)
    if args.update and out.with_suffix(".json").is_file():
        result = merged(json.loads(out.with_suffix(".json").read_text()), result)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=float))
    out.with_suffix(".md").write_text(markdown(result))
    if out.resolve() == (RESULTS / "twin_spans").resolve():
        write_doc_block(REPO / "docs" / "simulator.md", "twin_spans", how_close(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
