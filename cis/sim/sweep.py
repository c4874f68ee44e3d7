"""``cis simulate --sweep arrival_rate=LIST|LO:HI``: the same system at several loads, in parallel processes.

Every point scales every node's arrival rate by one factor (transfer caps,
workers and queue limits stay as the spec says) and runs with the same seed,
so neighbouring points differ by the load only. A point meets a latency SLO
when at least 99 % of *all* its requests finished within it; a dropped
request counts as a miss, so a point cannot meet the SLO by dropping.
A range LO:HI is searched for the largest factor that meets the SLO.
"""

from __future__ import annotations

import csv
import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cis.core.bundle import load_bundle
from cis.core.errors import CisError
from cis.core.records import format_ms
from cis.core.spec import CisSpec
from cis.sim.config import SimConfig, check_positive, override_nodes
from cis.sim.output import RUN_FILES, write_json
from cis.sim.simulation import simulate

SLO_QUANTILE = 0.99
SEARCH_TOLERANCE = 0.01  # a search stops when its bracket is narrower than this share of its upper end
POINT_COLUMNS = (
    "scale",
    "total_rate",
    "mean_s",
    "p50_s",
    "p99_s",
    "dropped",
    "drop_share",
    "accuracy",
    "within_slo",
    "meets_slo",
)


def parse_sweep(text: str) -> list[float] | tuple[float, float]:
    """``arrival_rate=0.5,1,2`` -> the load factors [0.5, 1.0, 2.0]; ``arrival_rate=0.5:4`` -> (0.5, 4.0), a
    range to search for the largest factor that meets the SLO."""
    key, _, values = text.partition("=")
    expected = (
        "expected arrival_rate=LIST, such as arrival_rate=0.5,1,1.5, or arrival_rate=LO:HI to search (factors on "
        "every node's arrival rate)"
    )
    if key.strip() != "arrival_rate" or not values:
        raise CisError(f"--sweep {text!r}: {expected}")
    parts = values.split(":") if ":" in values else values.split(",")
    try:
        scales = [float(v) for v in parts]
    except ValueError:
        raise CisError(f"--sweep {text!r}: {expected}") from None
    if any(not (math.isfinite(s) and s > 0) for s in scales):
        raise CisError(f"--sweep {text!r}: expected factors > 0")
    if ":" in values:
        if len(scales) != 2 or scales[0] >= scales[1]:
            raise CisError(f"--sweep {text!r}: a search range is LO:HI with 0 < LO < HI")
        return scales[0], scales[1]
    return scales


def within_slo(latency: np.ndarray, served: np.ndarray, slo_s: float) -> float:
    """Share of all requests that were served within ``slo_s`` (drops are misses)."""
    return float(((latency <= slo_s) & served).mean()) if len(latency) else 0.0


def run_point(spec: CisSpec, config: SimConfig, bundle_path: str | None, scale: float, slo_s: float | None) -> dict:
    """One load of the sweep (runs in a worker process)."""
    bundle = load_bundle(bundle_path, verify=False) if bundle_path else None
    result = simulate(override_nodes(spec, scale=scale), config, bundle)
    s, req = result.summary, result.requests
    share = None if slo_s is None else within_slo(req["finish"] - req["arrive"], req["exit"] > 0, slo_s)
    return {
        "scale": scale,
        "total_rate": scale * sum(n.arrival_rate for n in spec.nodes),
        "mean_s": s["latency"]["mean_s"],
        "p50_s": s["latency"]["p50_s"],
        "p99_s": s["latency"]["p99_s"],
        "dropped": s["requests"]["dropped"],
        "drop_share": s["drop_share"],
        "accuracy": s["accuracy"],
        "within_slo": share,
        "meets_slo": None if share is None else share >= SLO_QUANTILE,
        "exit_share": {e: x["share"] for e, x in s["exits"].items()},
    }


def sweep(
    spec: CisSpec,
    config: SimConfig,
    scales: list[float] | tuple[float, float],
    bundle_path: str | None = None,
    slo_ms: float | None = None,
    jobs: int | None = None,
    tolerance: float = SEARCH_TOLERANCE,
) -> dict:
    """Run every load in parallel; the capacity is the largest load that meets the SLO.

    ``scales`` as a (LO, HI) tuple searches instead: LO and HI first, then rounds of ``jobs``
    loads spread evenly inside the bracket (the largest load meeting the SLO below, the smallest
    missing it above), until the bracket is narrower than ``tolerance`` of HI. Every load run is
    a point of the result."""
    search = isinstance(scales, tuple)
    _check_sweep(config, search, slo_ms, jobs)
    config = replace(config, progress=False)
    slo_s = None if slo_ms is None else slo_ms / 1000
    jobs = max(1, jobs or os.cpu_count() or 1)
    points: dict[float, dict] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:

        def run(loads: list[float]) -> None:
            futures = [pool.submit(run_point, spec, config, bundle_path, s, slo_s) for s in loads if s not in points]
            for future in tqdm(
                as_completed(futures), total=len(futures), desc="sweep", unit="load", leave=False, disable=None
            ):
                point = future.result()
                points[point["scale"]] = point

        if not search:
            run(list(scales))
        else:
            lo, hi = scales
            run([lo, hi])
            while points[lo]["meets_slo"] and not points[hi]["meets_slo"] and (hi - lo) > tolerance * hi:
                step = (hi - lo) / (max(2, jobs) + 1)
                run([lo + step * i for i in range(1, max(2, jobs) + 1)])
                inside = sorted(s for s in points if lo <= s <= hi)
                lo = max(s for s in inside if points[s]["meets_slo"])
                hi = min(s for s in inside if s > lo and not points[s]["meets_slo"])
    ordered = [points[s] for s in (sorted(points) if search else scales)]
    meeting = [p for p in ordered if p["meets_slo"]]
    capacity = max(meeting, key=lambda p: p["scale"]) if meeting else None
    return {
        "spec": spec.name,
        "config": config.to_json(),
        "slo_p99_ms": slo_ms,
        "search": list(scales) if search else None,
        "points": ordered,
        "capacity": None if capacity is None else {"scale": capacity["scale"], "total_rate": capacity["total_rate"]},
    }


def _check_sweep(config: SimConfig, search: bool, slo_ms: float | None, jobs: int | None) -> None:
    if slo_ms is not None:
        check_positive(slo_ms, "--slo-p99")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise CisError(f"simulate: --jobs is {jobs}; expected an integer >= 1 (parallel processes)")
    if config.arrivals == "trace":
        raise CisError(
            "--sweep scales the spec's arrival rates; expected generated arrivals (poisson, deterministic, mmpp), not "
            "a trace"
        )
    if search and slo_ms is None:
        raise CisError(
            "--sweep arrival_rate=LO:HI searches for the largest load meeting --slo-p99; expected --slo-p99 MS"
        )


def capacity_table(result: dict) -> str:
    """The text table ``cis simulate --sweep`` prints."""
    slo = result["slo_p99_ms"]
    lines = [
        f"{'load':>8}{'req/s':>10}{'mean ms':>10}{'p99 ms':>10}{'drops':>8}{'accuracy':>10}"
        + (f"{'in SLO':>9}" if slo else "")
    ]
    for p in result["points"]:
        acc = "-" if p["accuracy"] is None else f"{p['accuracy'] * 100:.2f}%"
        mean, p99 = format_ms(p["mean_s"]), format_ms(p["p99_s"])
        row = f"{p['scale']:>8.4g}{p['total_rate']:>10.1f}{mean:>10}{p99:>10}{p['dropped']:>8}{acc:>10}"
        if slo:
            row += f"{p['within_slo'] * 100:>8.1f}%"
        lines.append(row)
    if slo:
        cap = result["capacity"]
        lines.append("")
        lines.append(
            f"largest load meeting p99 <= {slo:g} ms: "
            + (f"x{cap['scale']:.4g} ({cap['total_rate']:.1f} req/s)" if cap else "none of the loads tried")
            + (f" (searched x{result['search'][0]:g} to x{result['search'][1]:g})" if result.get("search") else "")
        )
    return "\n".join(lines)


def write_sweep(out: str | Path, result: dict) -> None:
    """sweep.json and sweep.csv; an earlier single run's files there (:data:`cis.sim.output.RUN_FILES`) are
    removed, so the folder holds this sweep's files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    write_json(out / "sweep.json", result)
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(POINT_COLUMNS)
        for p in result["points"]:
            w.writerow(["" if p[c] is None else p[c] for c in POINT_COLUMNS])
