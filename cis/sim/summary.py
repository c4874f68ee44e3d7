"""Turn a finished run into numbers: rates, utilisation, queues, latency, accuracy.

The statistics are small pure functions over the request log and the station
counters. Time averages use the whole run (``makespan``: until the last request
finished); rates use the arrival window (``horizon``), so observed rates compare
directly with the rate calculus. Mean queue length is Little's law over the run:
total waiting time / makespan.
"""

from __future__ import annotations

import numpy as np

from cis.core.rates import Rates, compute_rates
from cis.core.records import format_ms, latency_summary
from cis.runtime.wire import FLAG_CAPPED, FLAG_DEGRADED
from cis.sim.model import Model, Plan


def per_second(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def mean_correct(correct: np.ndarray) -> float | None:
    """Accuracy over requests whose correctness is known (-1 marks unknown)."""
    known = correct[correct >= 0]
    return float(known.mean()) if len(known) else None


def summarise(plan: Plan, model: Model, requests: dict[str, np.ndarray]) -> dict:
    """The ``cis simulate --json`` result."""
    spec, config = plan.spec, plan.config
    horizon = config.duration if config.duration is not None else model.last_arrival
    finish = requests["finish"]
    makespan = max(float(finish.max()) if len(finish) else 0.0, horizon)
    latency = finish - requests["arrive"]
    served = requests["exit"] > 0
    arrived = len(latency)
    rates = compute_rates(spec)
    return {
        "spec": spec.name,
        "config": config.to_json(),
        "decision": _decision(plan),
        "requests": {"arrived": arrived, "served": int(served.sum()), "dropped": int(arrived - served.sum())},
        "horizon_s": horizon,
        "makespan_s": makespan,
        "latency": latency_summary(latency[served]),
        "accuracy": mean_correct(requests["correct"][served]),
        "drop_share": share(int(arrived - served.sum()), arrived),
        "degraded_share": share(int(np.count_nonzero(requests["flags"] & FLAG_DEGRADED)), arrived),
        "capped_share": share(int(np.count_nonzero(requests["flags"] & FLAG_CAPPED)), arrived),
        "nodes": _nodes(plan, model, requests, rates, horizon, makespan),
        "exits": _exits(plan, requests, rates, horizon, latency),
        "links": _links(plan, model, makespan),
        "hosts": {
            h.id: {"cores": h.cores, "nodes": [n.id for n in spec.on_host(h.id)],
                   "utilisation": share(model.machine.host_busy[h.id] if model.machine else 0.0,
                                        h.cores * makespan)}
            for h in spec.hosts
        },
    }


def _nodes(
    plan: Plan, model: Model, requests: dict[str, np.ndarray], rates: Rates, horizon: float, makespan: float
) -> dict[str, dict]:
    """Per node: what it received, served, forwarded, dropped; how busy it was; the calculus' rates."""
    local = np.bincount(requests["entry"], minlength=len(plan.spec.nodes))
    nodes = {}
    for node in plan.spec.nodes:
        st = model.stations[node.id]
        nodes[node.id] = {
            "exit": node.exit,
            "workers": node.workers,
            "replicas": node.replicas,
            "queue_limit": node.queue_limit,
            "arrival_rate": per_second(int(local[st.index]), horizon),
            "incoming_rate": per_second(st.received, horizon),
            "served_rate": per_second(st.served, horizon),
            "forwarded_rate": per_second(st.forwarded, horizon),
            "capped_rate": per_second(st.capped, horizon),
            "dropped": st.dropped,
            "refused": st.refused,
            "degraded": st.degraded,
            "batches": st.batches,
            "utilisation": share(st.busy, st.servers * makespan),
            "mean_queue": share(st.waited, makespan),
            "max_queue": st.max_queue,
            "calculus": {"serving_rate": rates.serving_rate[node.id], "transfer_rate": rates.transfer_rate[node.id]},
        }
    return nodes


def _exits(
    plan: Plan, requests: dict[str, np.ndarray], rates: Rates, horizon: float, latency: np.ndarray
) -> dict[str, dict]:
    """Per exit: the rate and share it served (beside the calculus'), their latency and accuracy."""
    arrived, calculus_share = len(latency), rates.exit_share
    exits = {}
    for e in range(1, plan.spec.num_exits + 1):
        here = requests["exit"] == e
        exits[str(e)] = {
            "rate": per_second(int(here.sum()), horizon),
            "share": share(int(here.sum()), arrived),
            "calculus_rate": rates.exit_serving_rate[e],
            "calculus_share": calculus_share[e],
            "latency": latency_summary(latency[here]),
            "accuracy": mean_correct(requests["correct"][here]),
        }
    return exits


def _links(plan: Plan, model: Model, makespan: float) -> dict[str, dict]:
    """Per link up the tree: forwards sent, bytes per forward (payload and on the wire), utilisation."""
    links = {}
    for node in plan.spec.nodes:
        up = model.stations[node.id].uplink
        if up is not None:
            links[f"{node.id}->{node.parent}"] = {
                "sent": up.up.sent,
                "payload_bytes": plan.payloads[node.exit],
                "wire_bytes": (plan.messages or plan.payloads)[node.exit],
                "utilisation": share(up.up.busy, makespan),
            }
    return links


def _decision(plan: Plan) -> dict:
    if plan.policy is not None:
        kind = "thresholds" if plan.policy.thresholded else plan.policy.measure
        assert plan.profile is not None  # a policy comes with the bundle's profile
        return {"kind": kind, **plan.policy.to_json(), "profile_samples": plan.profile.samples}
    return {"kind": "shares", "shares": plan.shares}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def human_summary(summary: dict) -> str:
    """The text ``cis simulate`` prints."""
    r, lat = summary["requests"], summary["latency"]
    lines = [
        f"{summary['spec']}: {r['arrived']} requests over {summary['horizon_s']:.1f} s simulated, "
        f"{r['served']} served, {r['dropped']} dropped ({_pct(summary['drop_share'])})",
        f"latency ms: mean {format_ms(lat['mean_s'])}  p50 {format_ms(lat['p50_s'])}  p95 {format_ms(lat['p95_s'])}  "
        f"p99 {format_ms(lat['p99_s'])}",
    ]
    if summary["accuracy"] is not None:
        lines.append(f"estimated CIS accuracy: {summary['accuracy'] * 100:.2f}%")
    lines += ["", f"{'exit':<6}{'rate':>9}{'calc':>9}{'share':>8}{'calc':>8}{'p50 ms':>9}{'p99 ms':>9}{'acc':>8}"]
    for e, x in summary["exits"].items():
        lines.append(
            f"{e:<6}{_num(x['rate']):>9}{x['calculus_rate']:>9.2f}{_pct(x['share']):>8}{_pct(x['calculus_share']):>8}"
            f"{format_ms(x['latency']['p50_s']):>9}{format_ms(x['latency']['p99_s']):>9}{_pct(x['accuracy']):>8}"
        )
    lines += [
        "",
        f"{'node':<12}{'exit':>5}{'in/s':>9}{'served/s':>10}{'calc':>9}{'fwd/s':>8}{'calc':>8}{'capped/s':>10}"
        f"{'util':>8}{'queue':>7}{'max q':>7}{'drops':>7}",
    ]
    for nid, n in summary["nodes"].items():
        lines.append(
            f"{nid:<12}{n['exit']:>5}{_num(n['incoming_rate']):>9}{_num(n['served_rate']):>10}{n['calculus']['serving_rate']:>9.2f}"
            f"{_num(n['forwarded_rate']):>8}{n['calculus']['transfer_rate']:>8.2f}{_num(n['capped_rate']):>10}"
            f"{_pct(n['utilisation']):>8}{_num(n['mean_queue']):>7}{n['max_queue']:>7}{n['dropped']:>7}"
        )
    if summary["links"]:
        lines += ["", f"{'link':<20}{'sent':>9}{'bytes':>9}{'util':>8}"]
        for name, link in summary["links"].items():
            lines.append(f"{name:<20}{link['sent']:>9}{link['payload_bytes']:>9}{_pct(link['utilisation']):>8}")
    return "\n".join(lines)
