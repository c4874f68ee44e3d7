"""Files a run writes with ``--out DIR``: result.json, requests.csv, nodes.csv and PNG plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

NODE_COLUMNS = (
    "exit", "workers", "queue_limit", "arrival_rate", "incoming_rate", "served_rate", "forwarded_rate",
    "capped_rate", "dropped", "utilisation", "mean_queue", "max_queue",
)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def write_requests_csv(path: Path, requests: dict[str, np.ndarray], node_ids: list[str]) -> None:
    """One row per request: where it arrived, where it ended, when, and (with a bundle) whether it was right."""
    latency = requests["finish"] - requests["arrive"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "entry", "node", "exit", "outcome", "correct", "arrive_s", "finish_s", "latency_s"])
        for rid, entry, node, exit_, correct, arrive, finish, lat in zip(
            requests["id"].tolist(), requests["entry"].tolist(), requests["node"].tolist(), requests["exit"].tolist(),
            requests["correct"].tolist(), requests["arrive"].tolist(), requests["finish"].tolist(), latency.tolist(),
        ):
            w.writerow([
                rid, node_ids[entry], node_ids[node], exit_ or "", "served" if exit_ else "dropped",
                "" if correct < 0 else correct, f"{arrive:.9f}", f"{finish:.9f}", f"{lat:.9f}",
            ])


def write_nodes_csv(path: Path, summary: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["node", *NODE_COLUMNS, "calculus_serving_rate", "calculus_transfer_rate", "link_utilisation"])
        links = {name.split("->")[0]: link for name, link in summary["links"].items()}
        for nid, n in summary["nodes"].items():
            link = links.get(nid)
            w.writerow([
                nid, *("" if n[c] is None else n[c] for c in NODE_COLUMNS),
                n["calculus"]["serving_rate"], n["calculus"]["transfer_rate"], "" if link is None else link["utilisation"],
            ])


def write_plots(out: Path, summary: dict, requests: dict[str, np.ndarray]) -> list[str]:
    """latency_cdf.png and utilisation.png; returns notes (empty, or why plots were skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed (pip install 'cis[plot]'); plots skipped"]
    latency = (requests["finish"] - requests["arrive"]) * 1000
    fig, ax = plt.subplots(figsize=(6, 4))
    for e in summary["exits"]:
        lat = np.sort(latency[requests["exit"] == int(e)])
        if len(lat):
            ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=f"exit {e}")
    ax.set(xlabel="end-to-end latency (ms)", ylabel="fraction of requests", title=f"{summary['spec']}: latency CDF per exit")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=120)
    plt.close(fig)

    names = list(summary["nodes"])
    util = [summary["nodes"][n]["utilisation"] or 0.0 for n in names]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(names) + 2), 4))
    ax.bar(names, util)
    ax.set(ylabel="utilisation", ylim=(0, max(1.0, max(util, default=0))), title=f"{summary['spec']}: utilisation per node")
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(out / "utilisation.png", dpi=120)
    plt.close(fig)
    return []


def write_outputs(out: str | Path, summary: dict, requests: dict[str, np.ndarray]) -> list[str]:
    """Write every output file of one run; returns notes for the user."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "result.json", summary)
    write_requests_csv(out / "requests.csv", requests, list(summary["nodes"]))
    write_nodes_csv(out / "nodes.csv", summary)
    return write_plots(out, summary, requests)
