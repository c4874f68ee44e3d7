"""The report's plots: training curves, served shares per view, the latency CDF, the bundle's latency profile.

matplotlib when installed; without it no plot is made and a note says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cis.cli.reports.compare import VIEW_LABELS
from cis.core.records import draw_latency_cdf, read_requests, served_latencies

NO_MATPLOTLIB = "matplotlib is not installed (pip install 'cis-inference[plot]'); plots skipped"


def _curves(ax1: Any, ax2: Any, c: Mapping[str, Any]) -> None:
    for e, v in c["val_exit_accuracy"].items():
        ax1.plot(c["round"], [np.nan if x is None else 100 * x for x in v], marker=".", label=f"exit {e}")
    if any(x is not None for x in c["val_cis_accuracy"]):
        cis = [np.nan if x is None else 100 * x for x in c["val_cis_accuracy"]]
        ax1.plot(c["round"], cis, "k--", label="CIS (quota)")
    ax1.set(xlabel="round", ylabel="validation accuracy (%)", title="accuracy per exit")
    for e, v in c["loss"].items():
        ax2.plot(c["round"], [np.nan if x is None else x for x in v], marker=".", label=f"exit {e}")
    ax2.set(xlabel="round", ylabel="training loss", title="loss per exit")
    for a in (ax1, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)


def share_views(report: Mapping[str, Any]) -> dict[str, Mapping[str, float]]:
    """The served shares per exit the report can compare: the demo's views, a simulation against the
    calculus, or a bundle's calibration against its target."""
    if report.get("comparison"):
        return report["comparison"]["served_share"]
    if report.get("sim"):
        ex = report["sim"]["exits"]
        return {"calculus": {e: x["calculus_share"] for e, x in ex.items()},
                "sim": {e: x["share"] for e, x in ex.items()}}
    if report.get("bundle") and report["bundle"].get("calibration"):
        cal = report["bundle"]["calibration"]
        return {"calculus": cal["target_share_per_exit"], "offline": cal["achieved_share_per_exit"]}
    return {}


def _shares(ax: Any, views: Mapping[str, Mapping[str, float]]) -> None:
    exits = list(next(iter(views.values())))
    w = 0.8 / len(views)
    for k, (name, v) in enumerate(views.items()):
        x = np.arange(len(exits)) + (k - (len(views) - 1) / 2) * w
        ax.bar(x, [100 * (v.get(e) or 0) for e in exits], w, label=VIEW_LABELS.get(name, name))
    ax.set_xticks(range(len(exits)), [f"exit {e}" for e in exits])
    ax.set(ylabel="served share (%)", title="served share per exit")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def latency_curves(report: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{view: (latency_s, exit)} of the served requests in the report's requests.csv files."""
    out = {}
    for key, name in (("runtime", "runtime"), ("sim", "simulator")):
        csv = Path(report[key]["path"]) / "requests.csv" if report.get(key) else None
        if csv is not None and csv.is_file():
            out[name] = served_latencies(read_requests(csv))
    return out


def _profile(ax: Any, prof: Mapping[str, Mapping[str, float]]) -> None:
    for k, v in prof.items():
        ax.plot([int(x) for x in v], [1000 * t for t in v.values()], marker="o", label=f"stage {k}")
    ax.set(xlabel="batch size", ylabel="ms per call (onnxruntime)", title="latency profile")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def write_plots(report: Mapping[str, Any], folder: Path) -> tuple[dict[str, Path], list[str]]:
    """training_curves.png, served_shares.png, latency_cdf.png, latency_profile.png (those that apply)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, [NO_MATPLOTLIB]
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=110)
        plt.close(fig)
        made[name] = folder / f"{name}.png"

    run = report.get("run")
    if run and run["curves"]["round"]:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
        _curves(a1, a2, run["curves"])
        save(fig, "training_curves")
    views = share_views(report)
    if views:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        _shares(ax, views)
        save(fig, "served_shares")
    curves = latency_curves(report)
    if curves:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        draw_latency_cdf(ax, curves)
        save(fig, "latency_cdf")
    b = report.get("bundle")
    if b and b.get("latency_profile_s"):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        _profile(ax, b["latency_profile_s"])
        save(fig, "latency_profile")
    return made, []
