"""The rate calculus of the CIS paper (section 3.1).

For every node i, with children N_i^-:

    incoming(i)   = lambda_a(i) + sum_j lambda_t(j)            (requests reaching i)
    lambda_t(i)   = min(mu_max(i), incoming(i))                (transfer rate; 0 at the root)
    lambda_s(i)   = incoming(i) - lambda_t(i)                  (serving rate)
    Lambda_e      = sum of lambda_s(i) over nodes with E_i = e (exit serving rate)

A node forwards as much as its cap allows, because serving a request at a
deeper exit never costs accuracy in the paper's model (footnote 1).

What a running CIS measures (:mod:`cis.runtime.measure`) comes as the same :class:`Rates`,
and :func:`compare_rates` sets it beside a spec's calculus: the one place where the
measurement and the design meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cis.core.spec import CisSpec

RATE_KEYS = ("arrival_rate", "transfer_rate", "serving_rate")


@dataclass(frozen=True)
class Rates:
    """Per-node and per-exit rates (of a spec, or measured), in requests per second."""

    incoming: dict[str, float]
    transfer_rate: dict[str, float]
    serving_rate: dict[str, float]
    exit_serving_rate: dict[int, float]
    arrival_rate: dict[str, float] = field(default_factory=dict)  # lambda_a: requests arriving from clients

    @property
    def total(self) -> float:
        return sum(self.exit_serving_rate.values())

    @property
    def exit_share(self) -> dict[int, float]:
        """Lambda_e / sum Lambda: the share of all requests served at each exit."""
        total = self.total
        return {e: (r / total if total > 0 else 0.0) for e, r in self.exit_serving_rate.items()}

    def served_fraction(self, node_id: str) -> float:
        """f_i: the fraction of what reaches node i that it serves itself."""
        inc = self.incoming[node_id]
        return self.serving_rate[node_id] / inc if inc > 0 else 1.0


def compute_rates(spec: CisSpec) -> Rates:
    """Transfer, serving and exit serving rates by the paper's recurrence."""
    incoming: dict[str, float] = {}
    transfer: dict[str, float] = {}
    serving: dict[str, float] = {}
    for node in spec.bottom_up():
        inc = node.arrival_rate + sum(transfer[c.id] for c in spec.children(node.id))
        out = 0.0 if node.parent is None else min(node.max_transfer_rate, inc)
        incoming[node.id], transfer[node.id], serving[node.id] = inc, out, inc - out
    per_exit = {e: 0.0 for e in range(1, spec.num_exits + 1)}
    for node in spec.nodes:
        per_exit[node.exit] += serving[node.id]
    order = spec.ids
    return Rates(
        incoming={i: incoming[i] for i in order},
        transfer_rate={i: transfer[i] for i in order},
        serving_rate={i: serving[i] for i in order},
        exit_serving_rate=per_exit,
        arrival_rate={n.id: n.arrival_rate for n in spec.nodes},
    )


def rates_to_json(spec: CisSpec, rates: Rates) -> dict:
    """The ``cis rates --json`` shape."""
    shares = rates.exit_share
    return {
        "nodes": {
            n.id: {
                "exit": n.exit,
                "arrival_rate": rates.arrival_rate.get(n.id, n.arrival_rate),
                "transfer_rate": rates.transfer_rate[n.id],
                "serving_rate": rates.serving_rate[n.id],
            }
            for n in spec.nodes
        },
        "exits": {str(e): {"serving_rate": r, "share": shares[e]} for e, r in rates.exit_serving_rate.items()},
    }


def compare_rates(spec: CisSpec, measured: Rates) -> dict:
    """Measured rates beside the spec's calculus: per node and per exit, ``spec``, ``measured`` and their
    ``difference`` (measured - spec), rates in requests/s, shares as fractions."""
    design = compute_rates(spec)
    nodes = {}
    for n in spec.nodes:
        d = {k: getattr(design, k)[n.id] for k in RATE_KEYS}
        m = {k: getattr(measured, k)[n.id] for k in RATE_KEYS}
        nodes[n.id] = {"exit": n.exit, "spec": d, "measured": m, "difference": {k: m[k] - d[k] for k in RATE_KEYS}}
    exits = {}
    d_share, m_share = design.exit_share, measured.exit_share
    for e in design.exit_serving_rate:
        d = {"serving_rate": design.exit_serving_rate[e], "share": d_share[e]}
        m = {"serving_rate": measured.exit_serving_rate.get(e, 0.0), "share": m_share.get(e, 0.0)}
        exits[str(e)] = {"spec": d, "measured": m, "difference": {k: m[k] - d[k] for k in d}}
    return {"nodes": nodes, "exits": exits}
