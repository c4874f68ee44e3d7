"""Files a run writes with ``--out DIR``: result.json, requests.csv, nodes.csv and PNG plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from cis.core.records import draw_latency_cdf, write_requests

PLOTS = ("latency_cdf.png", "utilisation.png")
RUN_FILES = ("result.json", "requests.csv", "nodes.csv", "spans.jsonl", *PLOTS)
"""Every file one run writes with ``--out``: a sweep into the same folder removes them (and a run a sweep's)."""
SWEEP_FILES = ("sweep.json", "sweep.csv")
NODE_COLUMNS = (
    "exit", "workers", "replicas", "queue_limit", "arrival_rate", "incoming_rate", "served_rate", "forwarded_rate",
    "capped_rate", "dropped", "refused", "degraded", "batches", "utilisation", "mean_queue", "max_queue",
)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def write_requests_csv(path: Path, requests: dict[str, np.ndarray], node_ids: list[str]) -> None:
    """One row per request (:data:`cis.core.records.REQUEST_COLUMNS`): where it arrived, where it ended, when,
    and (with a bundle) whether it was right."""
    exits = requests["exit"].tolist()
    write_requests(path, {
        "id": requests["id"].tolist(),
        "entry": [node_ids[i] for i in requests["entry"].tolist()],
        "node": [node_ids[i] for i in requests["node"].tolist()],
        "exit": [e or None for e in exits],
        "outcome": ["served" if e else "dropped" for e in exits],
        "correct": [None if c < 0 else c for c in requests["correct"].tolist()],
        "arrive_s": requests["arrive"].tolist(),
        "finish_s": requests["finish"].tolist(),
        "latency_s": (requests["finish"] - requests["arrive"]).tolist(),
        "flags": requests["flags"].tolist(),
    })


def write_nodes_csv(path: Path, summary: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["node", *NODE_COLUMNS, "calculus_serving_rate", "calculus_transfer_rate", "link_utilisation"])
        links = {name.split("->")[0]: link for name, link in summary["links"].items()}
        for nid, n in summary["nodes"].items():
            link = links.get(nid)
            w.writerow(
                [
                    nid,
                    *("" if n[c] is None else n[c] for c in NODE_COLUMNS),
                    n["calculus"]["serving_rate"],
                    n["calculus"]["transfer_rate"],
                    "" if link is None else link["utilisation"],
                ]
            )


def write_plots(out: Path, summary: dict, requests: dict[str, np.ndarray]) -> list[str]:
    """latency_cdf.png and utilisation.png; returns notes (empty, or why plots were skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed (pip install 'cis-inference[plot]'); plots skipped"]
    served = requests["exit"] > 0
    fig, ax = plt.subplots(figsize=(6, 4))
    latency = (requests["finish"] - requests["arrive"])[served]
    draw_latency_cdf(ax, {"simulator": (latency, requests["exit"][served])}, f"{summary['spec']}: latency CDF")
    fig.tight_layout()
    fig.savefig(out / PLOTS[0], dpi=120)
    plt.close(fig)

    names = list(summary["nodes"])
    util = [summary["nodes"][n]["utilisation"] or 0.0 for n in names]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(names) + 2), 4))
    ax.bar(names, util)
    ax.set(
        ylabel="utilisation", ylim=(0, max(1.0, max(util, default=0))), title=f"{summary['spec']}: utilisation per node"
    )
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(out / PLOTS[1], dpi=120)
    plt.close(fig)
    return []


def write_outputs(
    out: str | Path, summary: dict, requests: dict[str, np.ndarray], spans: dict[str, np.ndarray] | None = None,
    parents: dict[str, str | None] | None = None,
) -> list[str]:
    """Write every output file of one run (spans.jsonl when the run recorded spans); returns notes for the user.
    A file of an earlier run's that this one does not write (spans.jsonl without spans, the plots when they are
    skipped, an earlier sweep's sweep.json and sweep.csv) is removed, so the folder holds one run's files."""
    from cis.sim.spans import span_records, write_spans

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "result.json", summary)
    write_requests_csv(out / "requests.csv", requests, list(summary["nodes"]))
    write_nodes_csv(out / "nodes.csv", summary)
    if spans is not None:
        write_spans(out / "spans.jsonl", span_records(spans, list(summary["nodes"]), parents))
    notes = write_plots(out, summary, requests)
    stale = (["spans.jsonl"] if spans is None else []) + (list(PLOTS) if notes else []) + list(SWEEP_FILES)
    for name in stale:
        (out / name).unlink(missing_ok=True)
    return notes
