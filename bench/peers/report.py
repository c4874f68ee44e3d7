"""The peers benchmark's report: the goals' headline, the figures docs/runtime.md and README.md show (written
between their ``<!--peers NAME-->`` markers), and peers.md; every figure from the result JSON."""

from __future__ import annotations

import math

from bench import doc_marks

PENDING_DOOR = "pending front door (cis serve has no --http-port yet: issue 33)"
GOALS = {  # issue 34's goals: (figure, comparison, bound)
    "p50_three_tiers": ("cis p50 / Ray Serve p50, three tiers forced, batch 1", "<=", 0.25),
    "largest_rate": ("cis / Ray Serve largest rate under p99 100 ms", ">=", 8.0),
    "memory": ("cis / Ray Serve RSS of the 7-node tree", "<=", 0.3),
    "startup": ("cis / Ray Serve start-up to the first answer", "<=", 0.3),
    "door_p50_kserve": ("cis front door p50 / KServe p50, one tier, binary input", "<=", 0.5),
    "door_p50_mlserver": ("cis front door p50 / MLServer p50, one tier, JSON input", "<=", 0.5),
    "door_rate_kserve": ("cis front door / KServe largest rate, binary input", ">=", 2.0),
    "door_rate_mlserver": ("cis front door / MLServer largest rate, JSON input", ">=", 2.0),
}


def ratio(a, b) -> float | None:
    return None if a is None or b is None or not b else a / b


def dig(d: dict | None, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def best_of(one: dict, prefix: str, keys: tuple[str, ...], pick=min):
    """The best figure among the configurations of one single-model server (MLServer: 0 and 1 workers)."""
    vals = [v for k, row in one.items() if k.startswith(prefix) if (v := dig(row, *keys)) is not None]
    return pick(vals) if vals else None


# Ray Serve's figures that the best of its modes is taken for: (the keys into a mode's tree result, pick)
RAY_FIGURES = {
    "p50_forced": (("paths", "native", "light_forced", "p50_s"), min),
    "p50_spec": (("paths", "native", "light_spec", "p50_s"), min),
    "largest_rate": (("paths", "native", "largest_rate"), max),
    "http_p50": (("paths", "http", "light_forced", "p50_s"), min),
    "http_rate": (("paths", "http", "largest_rate"), max),
    "memory": (("rss_load", "rss_mb"), min),
    "startup": (("startup_s",), min),
}
MODE_LABEL = {"default": "default", "throughput": "throughput-optimized (RAY_SERVE_THROUGHPUT_OPTIMIZED=1)"}


def best_mode(modes: dict, figure: str) -> str | None:
    """The mode whose figure is best (lowest latency, memory, start-up; highest rate); None: none measured it."""
    keys, pick = RAY_FIGURES[figure]
    got = {m: v for m, r in modes.items() if (v := dig(r, *keys)) is not None}
    return pick(got, key=got.__getitem__) if got else None


def best_ray(modes: dict) -> dict:
    """Ray Serve at its best over its modes, figure by figure (``best_mode`` says which mode gave each): the
    native path's p50s and its largest rate (with that mode's sweep and overload), the HTTP path's, the memory
    under load and at rest, the start-up; the rest (the agreement, the configurations tried) from the mode that
    gave the largest rate."""
    ok = {m: r for m, r in modes.items() if "failed" not in r}
    if not ok:
        return {"failed": "; ".join(f"{m}: {r['failed']}" for m, r in modes.items())}
    won = {f: best_mode(ok, f) for f in RAY_FIGURES}
    base = ok[won["largest_rate"] or next(iter(ok))]
    out = {**base, "paths": {k: dict(v) for k, v in base.get("paths", {}).items()}, "best_mode": won}
    native, http = out["paths"].setdefault("native", {}), out["paths"].setdefault("http", {})
    take = {"p50_forced": (native, "light_forced"), "p50_spec": (native, "light_spec"),
            "http_p50": (http, "light_forced")}  # fmt: skip
    for figure, (path, key) in take.items():
        if won[figure]:
            path[key] = ok[won[figure]]["paths"]["native" if path is native else "http"][key]
    if won["http_rate"]:
        http.update({k: v for k, v in ok[won["http_rate"]]["paths"]["http"].items() if k != "light_forced"})
    for figure, keys in (("memory", ("rss_load", "rss_rest")), ("startup", ("startup_s", "ready_s"))):
        if won[figure]:
            out.update({k: ok[won[figure]].get(k) for k in keys})
    if won["p50_forced"]:
        out["best_for_p50"] = {**ok[won["p50_forced"]].get("best_for_p50", {}), "mode": won["p50_forced"]}
    out["best_for_rate"] = {**base.get("best_for_rate", {}), "mode": won["largest_rate"]}
    out["agreement"] = (ok.get("default") or base).get("agreement", {})
    return out


def headline(r: dict) -> dict:
    """The issue's goals, each as cis's figure, the peer's, their ratio and whether the goal is met."""
    cis, ray, one = dig(r, "tree", "cis") or {}, dig(r, "tree", "ray") or {}, r.get("single", {})
    door, binary = dig(one, "cis", "http") or {}, dig(one, "cis", "http_binary") or {}  # JSON, binary inputs
    pairs = {
        "p50_three_tiers": (dig(cis, "paths", "native", "light_forced", "p50_s"),
                            dig(ray, "paths", "native", "light_forced", "p50_s")),
        "largest_rate": (dig(cis, "paths", "native", "largest_rate"), dig(ray, "paths", "native", "largest_rate")),
        "memory": (dig(cis, "rss_load", "rss_mb"), dig(ray, "rss_load", "rss_mb")),
        "startup": (cis.get("startup_s"), ray.get("startup_s")),
        "door_p50_kserve": (dig(binary, "light", "p50_s"), dig(one, "kserve", "light", "p50_s")),
        "door_p50_mlserver": (dig(door, "light", "p50_s"), best_of(one, "mlserver", ("light", "p50_s"))),
        "door_rate_kserve": (binary.get("largest_rate"), dig(one, "kserve", "largest_rate")),
        "door_rate_mlserver": (door.get("largest_rate"), best_of(one, "mlserver", ("largest_rate",), max)),
    }  # fmt: skip
    out = {}
    for key, (ours, theirs) in pairs.items():
        what, op, bound = GOALS[key]
        q = ratio(ours, theirs)
        met = None if q is None else (q <= bound if op == "<=" else q >= bound)
        row = {"what": what, "cis": ours, "peer": theirs, "ratio": q, "goal": f"{op} {bound}", "met": met}
        if key.startswith("door") and "pending" in door:
            row["pending"] = PENDING_DOOR
        out[key] = row
    return out


def fmt(v, kind: str) -> str:
    """A figure as the docs and the markdown print it; ``pending`` when it was not measured."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "pending"
    if kind == "ms":
        return f"{v * 1000:.2f} ms"
    if kind == "x":
        return f"{v:.2f}x"
    if kind == "rate":
        return f"{v:,.0f}/s"
    if kind == "mb":
        return f"{v:,.0f} MB"
    if kind == "s":
        return f"{v:.1f} s"
    if kind == "cpu":
        return f"{v:.2f} ms"
    return str(v)


SHORT = {  # the goals as the README's sentence names them
    "p50_three_tiers": "p50 through three tiers against Ray Serve",
    "largest_rate": "largest rate against Ray Serve",
    "memory": "memory of the tree against Ray Serve",
    "startup": "start-up against Ray Serve",
    "door_p50_kserve": "front door p50 against KServe (binary input)",
    "door_p50_mlserver": "front door p50 against MLServer (JSON input)",
    "door_rate_kserve": "front door rate against KServe (binary input)",
    "door_rate_mlserver": "front door rate against MLServer (JSON input)",
}


def verdict(h: dict) -> str:
    """The goals met and the goals missed, each with its ratio: one sentence for the README."""
    said = {True: [], False: []}  # type: dict[bool, list[str]]
    for key, row in h.items():
        if row.get("met") is not None and "pending" not in row:
            said[row["met"]].append(f"{SHORT[key]} {fmt(row['ratio'], 'x')} ({row['goal']})")
    met = "; ".join(said[True]) or "none"
    missed = "; ".join(said[False]) or "none"
    return f"Goals met: {met}. Goals missed: {missed}"


def peer_ahead(h: dict) -> str:
    """The goals' figures where the peer does better than cis (not merely where a goal is missed), with both
    figures; "none" when cis is ahead on every one measured."""
    kinds = {"memory": "mb", "startup": "s"}
    ahead = []
    for key, row in h.items():
        q = row.get("ratio")
        if q is None or "pending" in row:
            continue
        if (q > 1) if row["goal"].startswith("<=") else (q < 1):
            kind = kinds.get(key, "ms" if "p50" in key else "rate")
            ahead.append(f"{SHORT[key]}: cis {fmt(row['cis'], kind)}, the peer {fmt(row['peer'], kind)}")
    return "; ".join(ahead) or "none"


def one_tier_figures(r: dict) -> dict[str, str]:
    """The docs' figures of the one-tier comparison (the front door against KServe and MLServer, the floor)."""
    one, h = r.get("single", {}), r["headline"]
    return {
        "door_p50": fmt(h["door_p50_mlserver"]["cis"], "ms"),
        "door_p50_binary": fmt(h["door_p50_kserve"]["cis"], "ms"),
        "kserve_p50": fmt(h["door_p50_kserve"]["peer"], "ms"),
        "mlserver_p50": fmt(h["door_p50_mlserver"]["peer"], "ms"),
        "door_rate": fmt(h["door_rate_mlserver"]["cis"], "rate"),
        "door_rate_binary": fmt(h["door_rate_kserve"]["cis"], "rate"),
        "kserve_rate": fmt(h["door_rate_kserve"]["peer"], "rate"),
        "mlserver_rate": fmt(h["door_rate_mlserver"]["peer"], "rate"),
        "one_tier_native_p50": fmt(dig(one, "cis", "native", "light", "p50_s"), "ms"),
        "one_tier_native_rate": fmt(dig(one, "cis", "native", "largest_rate"), "rate"),
        "door_p50_spin": fmt(dig(one, "cis", "http_binary_spin", "light", "p50_s"), "ms"),
        "null_p50": fmt(dig(one, "null", "light", "p50_s"), "ms"),
        "null_p50_binary": fmt(dig(one, "null_binary", "light", "p50_s"), "ms"),
        "null_rate": fmt(dig(one, "null", "largest_rate"), "rate"),
        "null_rate_binary": fmt(dig(one, "null_binary", "largest_rate"), "rate"),
        "client_cpu": fmt(dig(one, "null", "cost", "client_cpu_ms"), "cpu"),
        "client_cpu_binary": fmt(dig(one, "null_binary", "cost", "client_cpu_ms"), "cpu"),
        "server_cpu_cis": fmt(dig(one, "cis", "http", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_cis_binary": fmt(dig(one, "cis", "http_binary", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_cis_native": fmt(dig(one, "cis", "native", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_kserve": fmt(dig(one, "kserve", "cost", "server_cpu_ms"), "cpu"),
        "server_cpu_mlserver": fmt(dig(one, "mlserver_workers0", "cost", "server_cpu_ms"), "cpu"),
        "cost_rate": fmt(next((dig(p, "cost", "rate") for p in one.values() if dig(p, "cost", "rate")), None), "rate"),
        "verdict": verdict(h),
        "peer_ahead": peer_ahead(h),
        "stages_alone": fmt(dig(one, "stages_alone", "p50_s"), "ms"),
        "floor": (floors(one) or {}).get("text", "pending"),
        "stages_alone_b2b": fmt(dig(one, "stages_alone", "back_to_back", "p50_s"), "ms"),
        **{f"above_floor_{k}": fmt(v, "ms") for k, v in ((floors(one) or {}).get("above") or {}).items()},
    }  # fmt: skip


def figures(r: dict) -> dict[str, str]:
    """The figures docs/runtime.md shows ("cis or Ray Serve?"), by name, formatted, all from the result."""
    cis, ray, h = dig(r, "tree", "cis") or {}, dig(r, "tree", "ray") or {}, r["headline"]
    nat, rnat = dig(cis, "paths", "native") or {}, dig(ray, "paths", "native") or {}
    http, rhttp = dig(cis, "paths", "http") or {}, dig(ray, "paths", "http") or {}
    best = ray.get("best_for_rate") or {}
    agree = ray.get("agreement", {})
    f = {
        "machine": f"{r['machine']['cpus']} cores, load average {r['machine']['load_avg'][0]:.1f} at the start"
                   + (f" and {r['machine_end']['load_avg'][0]:.1f} at the end" if r.get("machine_end") else ""),
        "date": r.get("date", "pending"),
        "ray_version": r["versions"].get("ray") or "pending",
        "kserve_version": dig(r["versions"], "kserve", "kserve") or "pending",
        "mlserver_version": dig(r["versions"], "mlserver", "mlserver") or "pending",
        "ray_best": (f"max_batch_size {best['max_batch_size']}, batch_wait_timeout_s {best['batch_wait_timeout_s']}"
                     + (f", {MODE_LABEL.get(best['mode'], best['mode'])} mode" if best.get("mode") else "")
                     if best else "pending"),
        "p50_cis": fmt(dig(nat, "light_forced", "p50_s"), "ms"),
        "p50_ray": fmt(dig(rnat, "light_forced", "p50_s"), "ms"),
        "p50_ratio": fmt(h["p50_three_tiers"]["ratio"], "x"),
        "p99_cis": fmt(dig(nat, "light_forced", "p99_s"), "ms"),
        "p99_ray": fmt(dig(rnat, "light_forced", "p99_s"), "ms"),
        "p50_spec_cis": fmt(dig(nat, "light_spec", "p50_s"), "ms"),
        "p50_spec_ray": fmt(dig(rnat, "light_spec", "p50_s"), "ms"),
        "rate_cis": fmt(nat.get("largest_rate"), "rate"),
        "rate_ray": fmt(rnat.get("largest_rate"), "rate"),
        "rate_ratio": fmt(h["largest_rate"]["ratio"], "x"),
        "rss_cis": fmt(dig(cis, "rss_load", "rss_mb"), "mb"),
        "rss_ray": fmt(dig(ray, "rss_load", "rss_mb"), "mb"),
        "rss_ratio": fmt(h["memory"]["ratio"], "x"),
        "pss_cis": fmt(dig(cis, "rss_load", "pss_mb"), "mb"),
        "pss_ray": fmt(dig(ray, "rss_load", "pss_mb"), "mb"),
        "procs_cis": str(dig(cis, "rss_load", "processes") or "pending"),
        "procs_ray": str(dig(ray, "rss_load", "processes") or "pending"),
        "startup_cis": fmt(cis.get("startup_s"), "s"),
        "startup_ray": fmt(ray.get("startup_s"), "s"),
        "startup_ratio": fmt(h["startup"]["ratio"], "x"),
        "http_p50_cis": fmt(dig(http, "light_forced", "p50_s"), "ms"),
        "http_p50_ray": fmt(dig(rhttp, "light_forced", "p50_s"), "ms"),
        "http_rate_cis": fmt(http.get("largest_rate"), "rate"),
        "http_rate_ray": fmt(rhttp.get("largest_rate"), "rate"),
    }  # fmt: skip
    f.update(mode_figures(r, nat))
    f.update(one_tier_figures(r))
    for who, p in (("cis", nat), ("ray", rnat)):
        o = p.get("overload_2x") or {}
        f[f"overload_{who}"] = (
            f"{o['answered']:,} answered, {o['refused']:,} refused, {o['timed_out']:,} timed out of "
            f"{o['requests']:,}; RSS {o['rss_before_mb']:,.0f} -> {o['rss_after_mb']:,.0f} MB"
            if o else "pending"
        )
    for name in ("digits", "cifar10"):
        a = agree.get(name)
        f[f"agree_{name}"] = (f"{min(a['same_class'], a['same_exit'], a['same_node'])}/{a['samples']}"
                              if a else "pending")  # fmt: skip
    return f


FIGURE_NAMES = {"p50_forced": "p50 forced", "p50_spec": "p50 at the thresholds", "largest_rate": "largest rate",
                "http_p50": "HTTP p50", "http_rate": "HTTP rate", "memory": "memory", "startup": "start-up"}


def mode_figures(r: dict, nat: dict) -> dict[str, str]:
    """The docs' figures of Ray Serve's modes: which ran, which gave each figure, each mode's p50 forced and cis's
    p50 as a ratio of it."""
    modes = {m: t for m, t in (dig(r, "tree", "ray_modes") or {}).items() if "failed" not in t}
    won = dig(r, "tree", "ray", "best_mode") or {}
    f = {"ray_modes": " and ".join(MODE_LABEL.get(m, m) for m in modes) or "its default mode",
         "ray_best_modes": "; ".join(f"{FIGURE_NAMES[k]} {v}" for k, v in won.items() if v) or "pending"}  # fmt: skip
    for mode in ("default", "throughput"):
        theirs = dig(modes.get(mode), "paths", "native", "light_forced", "p50_s")
        f[f"p50_ray_{mode}"] = fmt(theirs, "ms")
        f[f"p50_ratio_{mode}"] = fmt(ratio(dig(nat, "light_forced", "p50_s"), theirs), "x")
    return f


def fill_docs(r: dict) -> int:
    """Write the figures into the docs where ``<!--peers NAME-->...<!--/peers-->`` marks them; how many."""
    return doc_marks.fill("peers", figures(r))


def _tree_row(label: str, p: dict) -> str:
    if "pending" in p:
        return f"| {label} | {p['pending']} | | | | | | |"
    o = p.get("overload_2x") or {}
    cells = [fmt(dig(p, phase, q), "ms") for phase in ("light_forced", "light_spec") for q in ("p50_s", "p99_s")]
    cells.append(fmt(p.get("largest_rate"), "rate"))
    if o:
        cells += [f"{o['answered']} / {o['refused']} / {o['timed_out']} of {o['requests']} at {o['rate']:.0f}/s",
                  f"{o['rss_before_mb']:.0f} -> {o['rss_after_mb']:.0f} MB"]  # fmt: skip
    else:
        cells += ["-", "-"]
    return f"| {label} | " + " | ".join(cells) + " |"


def _one_tier_row(label: str, p: dict | None) -> str:
    why = next((p[k] for k in ("pending", "not_installed", "failed") if p and k in p), None)
    if p is None or why:
        return f"| {label} | {why or 'not measured'} | | | | | | | |"
    given = lambda key, kind: fmt(p[key], kind) if key in p else "-"  # noqa: E731  (a row measured in part)
    cells = [fmt(dig(p, "light", "p50_s"), "ms"), fmt(dig(p, "light", "p99_s"), "ms"), given("largest_rate", "rate"),
             fmt(dig(p, "cost", "client_cpu_ms"), "cpu"), fmt(dig(p, "cost", "server_cpu_ms"), "cpu"),
             given("startup_s", "s"), given("rss_rest", "mb"), given("rss_peak", "mb")]  # fmt: skip
    return f"| {label} | " + " | ".join(cells) + " |"


ONE_TIER_ROWS = (  # (label, keys into the one-tier result)
    ("null endpoint, JSON (the client's floor)", ("null",)),
    ("null endpoint, binary (the client's floor)", ("null_binary",)),
    ("cis --node cloud, cis.Client (reference, not HTTP)", ("cis", "native")),
    ("cis front door, JSON (as MLServer)", ("cis", "http")),
    ("cis front door, binary (as KServe)", ("cis", "http_binary")),
    ("cis front door, binary, --spin (its core busy-polled: not compared)", ("cis", "http_binary_spin")),
)


def one_tier_markdown(r: dict) -> list[str]:
    one = r.get("single", {})
    pin = one.get("pinning")
    where = (f"The load generator ran on core {pin['load_generator']}, every server on cores {pin['servers']} "
             "(taskset)." if pin else "The load generator and the servers shared every core (no pinning).")  # fmt: skip
    rate = next((dig(p, "cost", "rate") for p in one.values() if dig(p, "cost", "rate")), None)
    lines = ["", "## One tier: the cloud node's stages behind cis, KServe and MLServer (tritonclient HTTP)", "",
             f"{where} CPU per request: user + system time of the load generator's process (client) and of every "
             f"process of the server (server), over a run at {fmt(rate, 'rate')}, divided by the answers.", "",
             "| server | p50 | p99 | largest rate, p99 < 100 ms | client CPU / request | server CPU / request "
             "| start-up | RSS at rest | RSS peak |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [_one_tier_row(label, dig(one, *keys)) for label, keys in ONE_TIER_ROWS if dig(one, *keys)]
    lines += [_one_tier_row(f"{k} ({p.get('encoding', '-')})", p) for k, p in one.items()
              if k not in ("cis", "null", "null_binary", "pinning", "stages_alone")]  # fmt: skip
    others = {k: p["others_cores"] for k, p in _one_tier_results(one) if p.get("others_cores") is not None}
    if others:
        lines += ["", "Other processes on the machine meanwhile, cores used on average: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in others.items()) + "."]  # fmt: skip
    floor = floors(one)
    if floor:
        lines += ["", f"The floor of every HTTP p50 here: the client alone (the null endpoint's p50) plus the stages "
                  f"alone (onnxruntime and the decision, one sample at a time in the load generator's process, spaced "
                  f"as the light load: {fmt(dig(one, 'stages_alone', 'p50_s'), 'ms')}; back to back "
                  f"{fmt(dig(one, 'stages_alone', 'back_to_back', 'p50_s'), 'ms')}): {floor['text']}."]  # fmt: skip
    return lines


def _one_tier_results(one: dict) -> list[tuple[str, dict]]:
    """(name, result) of every one-tier row measured."""
    rows = [(k, p) for k, p in one.items() if k not in ("cis", "pinning", "stages_alone") and isinstance(p, dict)]
    return [*((f"cis {k}", p) for k, p in (one.get("cis") or {}).items() if isinstance(p, dict)), *rows]


def floors(one: dict) -> dict | None:
    """The best p50 any server could give with this client and these stages, per encoding, and what that best
    would be as a ratio of each peer's p50 (a goal below it cannot be met by the server alone)."""
    stages = dig(one, "stages_alone", "p50_s")
    json_floor, bin_floor = dig(one, "null", "light", "p50_s"), dig(one, "null_binary", "light", "p50_s")
    if stages is None or json_floor is None or bin_floor is None:
        return None
    json_floor, bin_floor = json_floor + stages, bin_floor + stages
    ks = ratio(bin_floor, dig(one, "kserve", "light", "p50_s"))
    ml = ratio(json_floor, best_of(one, "mlserver", ("light", "p50_s")))
    text = (f"{fmt(bin_floor, 'ms')} with binary input ({fmt(ks, 'x')} of KServe's p50), {fmt(json_floor, 'ms')} "
            f"with JSON ({fmt(ml, 'x')} of MLServer's)")  # fmt: skip
    above = {"cis_binary": (dig(one, "cis", "http_binary", "light", "p50_s"), bin_floor),
             "kserve": (dig(one, "kserve", "light", "p50_s"), bin_floor),
             "cis_json": (dig(one, "cis", "http", "light", "p50_s"), json_floor),
             "mlserver": (best_of(one, "mlserver", ("light", "p50_s")), json_floor)}  # fmt: skip
    over = {k: None if v is None else v - f for k, (v, f) in above.items()}
    return {"binary_s": bin_floor, "json_s": json_floor, "kserve_ratio": ks, "mlserver_ratio": ml, "text": text,
            "above": over}


def modes_markdown(r: dict) -> list[str]:
    """Ray Serve's modes side by side, the best of them (the figures compared), and every configuration tried."""
    modes, best = r["tree"].get("ray_modes") or {}, r["tree"]["ray"].get("best_mode") or {}
    lines = ["", "## Ray Serve's modes", "",
             "Each mode ran in a driver process of its own, its server started with the mode's environment; each "
             "figure compared above is the best of the modes (the mode that gave it in the last row).", "",
             "| mode | p50 forced | p99 forced | p50 thresholds | largest rate | HTTP p50 forced | HTTP largest rate "
             "| RSS under load | start-up |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode, t in modes.items():
        if "failed" in t:
            lines.append(f"| {MODE_LABEL.get(mode, mode)} | failed: {t['failed']} | | | | | | | |")
            continue
        nat, http = dig(t, "paths", "native") or {}, dig(t, "paths", "http") or {}
        cells = [MODE_LABEL.get(mode, mode), fmt(dig(nat, "light_forced", "p50_s"), "ms"),
                 fmt(dig(nat, "light_forced", "p99_s"), "ms"), fmt(dig(nat, "light_spec", "p50_s"), "ms"),
                 fmt(nat.get("largest_rate"), "rate"), fmt(dig(http, "light_forced", "p50_s"), "ms"),
                 fmt(http.get("largest_rate"), "rate"), fmt(dig(t, "rss_load", "rss_mb"), "mb"),
                 fmt(t.get("startup_s"), "s")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    order = ("p50_forced", "p50_forced", "p50_spec", "largest_rate", "http_p50", "http_rate", "memory", "startup")
    lines.append("| best of the modes, from | " + " | ".join(best.get(f) or "-" for f in order) + " |")
    lines += ["", "Configurations tried (handle path):", "",
              "| mode | max_batch_size | batch_wait_timeout_s | p50 forced | p50 thresholds | largest rate |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for mode, t in modes.items():
        for c in t.get("configs_tried", []):
            cells = [mode, str(c["max_batch_size"]), str(c["batch_wait_timeout_s"]),
                     fmt(dig(c, "light_forced", "p50_s"), "ms"), fmt(dig(c, "light_spec", "p50_s"), "ms"),
                     fmt(c["largest_rate"], "rate")]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def tree_markdown(r: dict) -> list[str]:
    """The tree: each path's latency, rate and overload; memory and start-up; Ray Serve's modes."""
    lines = ["", "## The tree: paper-7, batch 1", "",
             "| path | p50 forced | p99 forced | p50 thresholds | p99 thresholds | largest rate, p99 < 100 ms "
             "| 2x that rate: answered / refused / timed out | RSS before -> after 2x |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    ray = "Ray Serve (best of its modes)" if r["tree"].get("ray_modes") else "Ray Serve"
    for who, label in (("cis", "cis"), ("ray", ray)):
        lines += [_tree_row(f"{label} {path}", p) for path, p in (r["tree"][who].get("paths") or {}).items()]
    lines += ["", "## Memory and start-up", "",
              "| system | processes | RSS at rest | RSS under load | PSS under load | start-up to first answer |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for who, label in (("cis", "cis serve --all"), ("ray", "Ray Serve app")):
        t = r["tree"][who]
        cells = [label, str(dig(t, "rss_load", "processes")), fmt(dig(t, "rss_rest", "rss_mb"), "mb"),
                 fmt(dig(t, "rss_load", "rss_mb"), "mb"), fmt(dig(t, "rss_load", "pss_mb"), "mb"),
                 fmt(t.get("startup_s"), "s")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    for who in ("cis", "ray"):
        rows = sorted(dig(r["tree"][who], "rss_load", "per_process") or [], key=lambda p: -p["rss_mb"])
        each = "; ".join(f"`{p['name']}` {p['rss_mb']:.0f} / {p['pss_mb'] or 0:.0f}" for p in rows)
        lines += ["", f"Processes of {who} under load (RSS / PSS, MB): {each}"]
    if r["tree"].get("ray_modes"):
        return lines + modes_markdown(r)
    lines += ["", "## Ray Serve configurations tried (handle path)", "",
              "| max_batch_size | batch_wait_timeout_s | p50 forced | p50 thresholds | largest rate |",
              "|---|---|---|---|---|"]  # fmt: skip
    for c in r["tree"]["ray"].get("configs_tried", []):
        cells = [str(c["max_batch_size"]), str(c["batch_wait_timeout_s"]), fmt(dig(c, "light_forced", "p50_s"), "ms"),
                 fmt(dig(c, "light_spec", "p50_s"), "ms"), fmt(c["largest_rate"], "rate")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(r: dict) -> list[str]:
    v, m = r["versions"], r["machine"]
    smoke = " -- QUICK SMOKE RUN, not a result" if r["quick"] else ""
    load = ", ".join(f"{x:.1f}" for x in m["load_avg"])
    end = r.get("machine_end")
    lines = [
        f"# cis against its peers (issue 34){smoke}",
        "",
        f"{m['cpus']} cores, load average {load} at the start"
        + (f" and {', '.join(f'{x:.1f}' for x in end['load_avg'])} at the end" if end else "")
        + f", {r['date']}, {r['seconds'] / 60:.1f} min. "
        f"Timed bundle: `{r['bundle']}`. Versions: cis {v.get('cis')}, Ray {v.get('ray')}, KServe "
        f"{dig(v, 'kserve', 'kserve')}, MLServer {dig(v, 'mlserver', 'mlserver')}, tritonclient "
        f"{v.get('tritonclient')}, onnxruntime {v.get('onnxruntime')}, Python {v.get('python')}.",
        "",
        *(["Run in two windows (`--only tree`, `--only one-tier`, then `--merge`): " + "; ".join(
            f"{name} {p['date']}, load average {p['machine']['load_avg'][0]:.1f} at its start, "
            f"{p['seconds'] / 60:.1f} min" for name, p in r["parts"].items()) + ".", ""] if r.get("parts") else []),
        "## The goals",
        "",
        "| figure | cis | peer | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for key, h in r["headline"].items():
        kind = "ms" if "p50" in key else "rate" if "rate" in key else "mb" if key == "memory" else "s"
        met = h.get("pending") or {True: "yes", False: "**no**", None: "-"}[h["met"]]
        cells = [h["what"], fmt(h["cis"], kind), fmt(h["peer"], kind), fmt(h["ratio"], "x"), h["goal"], met]
        lines.append("| " + " | ".join(cells) + " |")
    if r.get("tree"):
        lines += tree_markdown(r)
    if r.get("single"):
        lines += one_tier_markdown(r)
    lines += ["", "## The Ray Serve app answers what cis answers", ""] if r.get("tree") else []
    for name, a in (dig(r, "tree", "ray", "agreement") or {}).items():
        lines.append(f"- {name}: {a['samples']} samples one at a time; same class {a['same_class']}, same exit "
                     f"{a['same_exit']}, same serving node {a['same_node']}; largest confidence gap "
                     f"{a['max_confidence_gap']}; served per exit {a['served_share_per_exit']}")  # fmt: skip
    return [*lines, "", "## Notes", "", *[f"- {n}" for n in r["notes"]]]
