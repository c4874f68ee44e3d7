"""The runtime's spans against the twin's, per node and kind (bench/twin_spans.py).

- :func:`sent_profile`: the confidence profile of the samples a load sends (each sample's confidence and
  class at every exit, from the bundle's own stages), so the twin's requests exit where the runtime's do;
- :func:`replay_files`: the load's arrivals as a simulator trace, and each entry node's profile rows;
- :func:`with_answers`: the runtime's compute spans until the batch's answers were sent (the twin's hold
  the node's decision and sends);
- :func:`compare`: per node and kind (queue, compute, forward, request) the two distributions side by side
  (per sample: a runtime span of a message that carried k samples counts k times), and the end-to-end
  figures; :func:`parting`: which span holds the gap, by how much;
- :func:`plot_cdfs`: one panel per node and kind, the runtime's CDF against the twin's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cis.core.records import latency_summary
from cis.sim.spans import KINDS
from cis.sim.twin_batches import answers_sent

STATS = ("mean", "p50", "p95", "p99")


def sent_profile(bundle_dir: Path, x: np.ndarray):
    """cis.sim.service.Profile of ``x``: each sample's confidence and class at every exit (correctness unknown:
    False), computed with the bundle's stages and the spec's confidence measure."""
    from cis.core.bundle import load_bundle
    from cis.core.policy.confidence import confidence
    from cis.core.stages.runner import run_chain
    from cis.sim.service import Profile

    bundle = load_bundle(bundle_dir)
    measure = bundle.policy.measure if bundle.policy is not None else "max_softmax"
    logits = run_chain(bundle, x)
    exits = sorted(logits)
    conf = np.stack([confidence(logits[e], measure) for e in exits], axis=1)
    predicted = np.stack([logits[e].argmax(axis=1) for e in exits], axis=1)
    return Profile(conf.astype(np.float64), np.zeros(conf.shape, bool), predicted)


def replay_files(path: Path, times: np.ndarray, entries: dict[str, np.ndarray], samples: int) -> dict:
    """Write the trace (``entry,time`` per request) for ``SimConfig(arrivals="trace")``; return each entry
    node's profile rows in arrival order (request i carries sample i mod ``samples``)."""
    order = np.argsort(times, kind="stable")
    entry_of = {int(i): nid for nid, idx in entries.items() for i in idx}
    path.write_text("".join(f"{entry_of[int(i)]},{times[i]:.9f}\n" for i in order))
    return {nid: [int(i) % samples for i in order if entry_of[int(i)] == nid] for nid in entries}


def with_answers(cols: dict) -> dict:
    """The runtime's columns with each compute span running until its batch's answers were sent."""
    ends = answers_sent(cols)
    return cols | {"end": ends, "seconds": ends - cols["start"]}


def _summary(seconds: np.ndarray) -> dict:
    s = latency_summary(seconds)
    return {"count": s["count"], **{k: s[f"{k}_s"] for k in STATS}}


def per_kind(cols: dict, window: tuple[float, float], weight: bool) -> dict[str, dict[str, dict]]:
    """{node: {kind: summary}} of the spans that start in ``window``; ``weight``: a span counts once per sample
    it carried (the runtime's messages between nodes hold several). Queue and compute also get the mean
    batch a sample ran in, and the mean samples per message."""
    keep = (cols["start"] >= window[0]) & (cols["start"] < window[1])
    out: dict[str, dict[str, dict]] = {}
    for node in sorted(set(cols["node"][keep].tolist())):
        here = keep & (cols["node"] == node)
        out[node] = {}
        for kind in KINDS:
            at = here & (cols["kind"] == kind)
            if not at.any():
                continue
            reps = np.maximum(cols["samples"][at], 1) if weight else np.ones(int(at.sum()), int)
            entry = _summary(np.repeat(cols["seconds"][at], reps))
            entry["messages"] = int(at.sum())
            if kind in ("queue", "compute"):
                entry["mean_batch"] = float(np.mean(np.repeat(cols["batch"][at], reps)))
                entry["samples_per_message"] = float(reps.mean())
            out[node][kind] = entry
    return out


def rel(a: float | None, b: float | None) -> float | None:
    """(twin - runtime) / runtime: signed."""
    if a is None or b is None or b == 0:
        return None
    return (a - b) / b


def compare(runtime: dict, twin: dict, requests: dict[str, int]) -> dict:
    """Per node and kind, both summaries and the twin's signed relative error per statistic; and what each
    span adds to a request's mean latency (mean x spans per request: ``requests`` answered in each view)."""
    out: dict[str, dict] = {}
    for node in sorted(set(runtime) | set(twin)):
        out[node] = {}
        for kind in KINDS:
            rt, tw = runtime.get(node, {}).get(kind), twin.get(node, {}).get(kind)
            if rt is None and tw is None:
                continue
            entry: dict = {"runtime": rt, "twin": tw}
            if rt is not None and tw is not None:
                entry["error"] = {k: rel(tw[k], rt[k]) for k in STATS}
                entry["per_request_ms"] = {
                    "runtime": 1e3 * (rt["mean"] or 0) * rt["count"] / max(1, requests["runtime"]),
                    "twin": 1e3 * (tw["mean"] or 0) * tw["count"] / max(1, requests["twin"]),
                }
            out[node][kind] = entry
    return out


def parting(spans: dict, end_to_end: dict) -> dict:
    """Where the twin parts from the runtime: the queue and compute spans (unlike forward and request spans,
    they hold no other node's) ranked by what their gap adds to a request's mean latency, and what is left
    of the mean's gap outside them (``messaging_ms``: messaging; negative where queue spans reach back into the
    batch before them, as a runtime node stamps a message read after a batch)."""
    rows = []
    for node, kinds in spans.items():
        for kind in ("queue", "compute"):
            e = kinds.get(kind, {})
            if "per_request_ms" in e:
                pr = e["per_request_ms"]
                rows.append({"node": node, "kind": kind, "runtime_ms": pr["runtime"], "twin_ms": pr["twin"],
                             "gap_ms": pr["twin"] - pr["runtime"], "error": e["error"]})
    rows.sort(key=lambda r: -abs(r["gap_ms"]))
    messaging = {view: 1e3 * (end_to_end[view]["mean"] or 0) - sum(r[f"{view}_ms"] for r in rows)
                 for view in ("runtime", "twin")}
    return {"mean_gap_ms": 1e3 * ((end_to_end["twin"]["mean"] or 0) - (end_to_end["runtime"]["mean"] or 0)),
            "spans": rows, "messaging_ms": messaging, "messaging_gap_ms": messaging["twin"] - messaging["runtime"],
            "largest": rows[0] if rows else None}


def plot_cdfs(path: Path, runtime: dict, twin: dict, window_rt, window_tw, title: str) -> bool:
    """One panel per node (rows) and kind (columns): the runtime's CDF and the twin's. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    nodes = sorted(set(runtime["node"].tolist()) | set(twin["node"].tolist()))
    fig, axes = plt.subplots(len(nodes), len(KINDS), figsize=(3.2 * len(KINDS), 2.4 * len(nodes)), squeeze=False)
    for r, node in enumerate(nodes):
        for c, kind in enumerate(KINDS):
            ax = axes[r][c]
            for name, cols, window, style in (("runtime", runtime, window_rt, "-"), ("twin", twin, window_tw, "--")):
                at = ((cols["node"] == node) & (cols["kind"] == kind) & (cols["start"] >= window[0])
                      & (cols["start"] < window[1]))
                if not at.any():
                    continue
                ms = np.sort(np.repeat(cols["seconds"][at], np.maximum(cols["samples"][at], 1))) * 1e3
                ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), style, label=name)
            ax.set_title(f"{node} {kind}", fontsize=9)
            ax.set_xlabel("ms", fontsize=8)
            ax.tick_params(labelsize=7)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
