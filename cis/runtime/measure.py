"""What a running CIS measures, read back through one reader, whatever the source.

``cis rates --measured``, ``cis spec update``, ``cis train --rates-from`` and
``cis export --rates-from`` read served counts through :func:`measure`; the rate
calculus (:func:`cis.core.rates.compare_rates`) sets them beside a spec. A SOURCE is

- a spec (``.toml``): the live tree at the spec's addresses, each node asked for its ``status``;
- a log folder of ``cis serve --all --log-dir DIR`` (or its ``cluster.json``): the live tree
  the launcher started, asked for its ``status``;
- addresses (``cis rates --connect``): a ZeroMQ address is asked for its ``status``, an
  ``http://HOST:PORT/metrics`` URL is scraped (:mod:`cis.runtime.live_counts`);
- a requests file (``.csv``): ``cis infer --out``, or the requests.csv of ``cis simulate --out``,
  ``cis bench --out`` (its ``entry`` an address: the spec's node, or replica, at that address) and ``cis demo``;
- a saved measurement (``.json``): what ``cis rates --measured SOURCE --json`` printed.

Per node it counts ``served`` (samples answered there, per exit), ``forwarded`` (samples sent
to the parent and kept there: a forward the parent did not answer in time is served here,
degraded) and ``arrived`` (samples that entered the tree there). A requests file names each
request's entry node; a live node counts only what it decided, so there arrived = served +
forwarded - the children's forwarded (a sample still in flight between two nodes when a
snapshot is taken can make this one off).

The window of the counts (``seconds``; rates are counts / seconds):

- live, ``--window S``: two snapshots S seconds apart (their difference; a node restarted in
  between is an error); without ``--window``: the counters since the nodes started, over the
  longest uptime (a ``/metrics`` URL carries no start time, so it needs ``--window``);
- a requests file: the requests that arrived in the last S seconds of the file (``arrive_s`` or
  ``sent_s``); without ``--window``: all of them, from the first arrival to the last;
- a saved measurement: its own window (``--window`` is refused).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import tomli_w

from cis.core.errors import CisError
from cis.core.measurement import Measurement, from_counts, from_json
from cis.core.spec import CisSpec, load_spec, spec_to_dict
from cis.runtime import live_counts as live

CLUSTER_FILE = "cluster.json"  # cis.runtime.launcher.CLUSTER_FILE (not imported: the launcher pulls in subprocess)
TIME_COLUMNS = ("arrive_s", "sent_s")  # cis simulate / cis demo requests.csv; cis infer --out


# ---------------------------------------------------------------- sources


def check_window(window: float | None) -> float | None:
    if window is not None and not (math.isfinite(window) and window > 0):
        raise CisError(f"--window is {window!r}; expected seconds > 0")
    return window


def measure(
    source: str | None = None,
    spec: CisSpec | None = None,
    connect: Sequence[str] = (),
    window: float | None = None,
    timeout: float = 1.0,
) -> Measurement:
    """Read SOURCE (see the module doc), or the live nodes at ``connect``; ``spec`` gives the tree when the
    source does not (a requests file needs it; a metrics URL does where its labels do not name the parent).
    Between two live snapshots it logs (INFO) that the first was taken."""
    window = check_window(window)
    if connect:
        if source is not None:
            raise CisError("--measured SOURCE and --connect ADDR: give one of them")
        return live.measure_addresses(list(connect), spec, window, timeout)
    source, path = _source_path(source)
    if path.is_dir() or path.name == CLUSTER_FILE:
        cluster = _cluster_file(path)
        nodes = _cluster_nodes(cluster)
        tree = {v["node"]: (int(v["exit"]), v["parent"]) for v in nodes.values()}  # replicas: one node
        targets = {i: v["address"] for i, v in nodes.items()}
        return live.measure_status(str(cluster), targets, tree, window, timeout)
    if not path.is_file():
        raise CisError(
            f"{source}: not found; expected a spec (.toml), a log folder of 'cis serve --all', a requests file (.csv) "
            "or a saved measurement (.json)"
        )
    if path.suffix == ".csv":
        if spec is None:
            raise CisError(f"{source}: a requests file names nodes, not the tree; pass the spec (cis rates SPEC ...)")
        return read_requests_file(path, spec, window)
    if path.suffix == ".json":
        if window is not None:
            raise CisError(f"{source}: a saved measurement keeps its own window; drop --window")
        return from_json(_json(path), source)
    live_spec = load_spec(path)
    targets = {}
    for n in live_spec.nodes:
        if n.replica_addresses is None:
            raise CisError(f"{source}: node {n.id!r} has no address; expected one to ask for its status")
        targets.update(zip(n.replica_ids, n.replica_addresses))  # a node's replicas add up (live_counts)
    tree = {n.id: (n.exit, n.parent) for n in live_spec.nodes}
    return live.measure_status(source, targets, tree, window, timeout)


def _source_path(source: str | None) -> tuple[str, Path]:
    """SOURCE as a path: none, or an empty one (which would name the working folder), is one line."""
    if source is None:
        raise CisError("nothing to measure; expected --measured SOURCE or --connect ADDR")
    if not source.strip():
        raise CisError(f"the source to measure is empty ({source!r}); expected a spec (.toml), a log folder of "
                       "'cis serve --all', a requests file (.csv) or a saved measurement (.json)")
    return source, Path(source)


def design_of(source: str | None) -> tuple[CisSpec, str] | None:
    """The spec a source was built from, if it says: a spec itself, or the spec (else the bundle's) that
    ``cis serve --all`` served, as its cluster.json records; with where it came from."""
    if source is None:
        return None
    path = Path(source)
    if path.is_dir() or path.name == CLUSTER_FILE:
        cluster = _json(_cluster_file(path))
        if cluster.get("spec"):
            return load_spec(cluster["spec"]), str(cluster["spec"])
        if cluster.get("bundle"):
            from cis.core.bundle import load_bundle

            bundle = load_bundle(cluster["bundle"], verify=False)
            if bundle.spec is not None:
                return bundle.spec, f"{cluster['bundle']} (the bundle's spec)"
        return None
    if path.is_file() and path.suffix == ".toml":
        return load_spec(path), str(path)
    return None


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CisError(f"{path}: cannot read JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CisError(f"{path}: expected a JSON object")
    return data


def _cluster_file(path: Path) -> Path:
    f = path / CLUSTER_FILE if path.is_dir() else path
    if not f.is_file():
        raise CisError(f"{f}: not found; expected the {CLUSTER_FILE} that 'cis serve --all --log-dir DIR' writes")
    return f


def _cluster_nodes(path: Path) -> dict[str, dict]:
    try:
        nodes = _json(path)["nodes"]
        return {str(i): {"address": str(v["address"]), "exit": int(v["exit"]), "parent": v["parent"],
                         "node": str(v.get("node", i))} for i, v in nodes.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CisError(f"{path}: not a cluster state file ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------- requests files


def read_requests_file(path: str | Path, spec: CisSpec, window: float | None = None) -> Measurement:
    """Counts from a requests file: a row is served when it names a node and an exit; each node on the way
    from its entry node up to the node that served it forwarded it. Only served requests count (a dropped
    or failed one is in no node's served or forwarded count, so it is not counted as arrived either)."""
    path = Path(path)
    rows, time_col = _requests_rows(path)
    cells = [_row_cells(path, k + 2, r, time_col, spec) for k, r in enumerate(rows)]
    keep, seconds, how = _requests_window(path, np.array([c[3] for c in cells], dtype=float), time_col, window)
    pairs: dict[tuple[str, str], dict[int, int]] = {}
    arrived = {i: 0 for i in spec.ids}
    entries = _entry_names(spec)
    for k, (entry, node, ex, _) in enumerate(cells):
        if not keep[k]:
            continue
        if entry not in entries:
            raise CisError(f"{path}: row {k + 2}: entry {entry!r} is not a node of spec {spec.name!r}, nor the "
                           "address of a node or replica in it; expected a node id or an address the spec gives")
        entry = entries[entry]
        if node and ex > 0:
            arrived[entry] += 1
            per = pairs.setdefault((entry, node), {})
            per[ex] = per.get(ex, 0) + 1
    served, forwarded = _walked(path, spec, pairs)
    tree = {n.id: (n.exit, n.parent) for n in spec.nodes}
    return from_counts(str(path), "requests", how, seconds, tree, spec.num_exits, served, forwarded, arrived)


def _entry_names(spec: CisSpec) -> dict[str, str]:
    """What a requests file's ``entry`` may hold, to the node it names: a node id, or the address of a node or
    of one of its replicas (``cis bench`` writes the address it sent to)."""
    names = {a: n.id for n in spec.nodes for a in n.replica_addresses or ()}
    return {**names, **{i: i for i in spec.ids}}


def _requests_rows(path: Path) -> tuple[list[dict[str, str]], str]:
    """A requests file's rows and its time column; one line when a column it needs is missing."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        rows = list(reader)
    time_col = next((c for c in TIME_COLUMNS if c in header), None)
    missing = [c for c in ("entry", "node", "exit") if c not in header] + ([] if time_col else ["arrive_s or sent_s"])
    if missing or time_col is None:
        raise CisError(
            f"{path}: no column {missing[0]!r}; expected a requests file of 'cis infer --out', "
            "'cis simulate --out' or 'cis demo' (entry, node, exit and arrive_s or sent_s)"
        )
    return rows, time_col


def _row_cells(path: Path, line: int, row: dict, time_col: str, spec: CisSpec) -> tuple[str, str, int, float]:
    """A row's (entry, node, exit, time): exit 0 when empty (not served), time NaN when empty (unknown);
    one line naming the file, the row and the column of a short row, a cell that is not a number, an exit
    outside the spec's 1..E or a serving node the spec does not have."""
    if None in row:
        raise CisError(f"{path}: row {line}: {len(row[None])} cell(s) more than the header's {len(row) - 1} "
                       "columns; expected one cell per column")
    short = next((c for c, v in row.items() if v is None), None)
    if short is not None:
        raise CisError(f"{path}: row {line}: no cell in column {short!r} (the row is short); expected one cell per "
                       "column, an empty one for an unknown value")
    ex, t = row["exit"].strip(), row[time_col].strip()
    try:
        exit_ = int(ex) if ex else 0
    except ValueError:
        raise CisError(f"{path}: row {line}, column 'exit': {ex!r} is not an exit number; expected an integer "
                       "(empty: not served)") from None
    if ex and not 1 <= exit_ <= spec.num_exits:
        raise CisError(f"{path}: row {line}, column 'exit': {exit_} is not an exit of spec {spec.name!r}; expected "
                       f"1..{spec.num_exits} (empty: not served)")
    if exit_ and row["node"] and row["node"] not in spec.ids:
        raise CisError(f"{path}: row {line}, column 'node': {row['node']!r} is not a node of spec {spec.name!r}; "
                       f"expected one of {', '.join(spec.ids)}")
    try:
        when = float(t) if t else math.nan
    except ValueError:
        raise CisError(f"{path}: row {line}, column {time_col!r}: {t!r} is not a number; expected seconds "
                       "(empty: unknown)") from None
    return row["entry"], row["node"], exit_, when


def _requests_window(
    path: Path, t: np.ndarray, time_col: str, window: float | None
) -> tuple[np.ndarray, float, str]:
    """Which rows count (the window's, by their times ``t``), the window's seconds and how it was taken. A
    window longer than the file's span (first to last arrival) is refused: the file cannot say what arrived
    before its first request, and dividing by the longer window would understate every rate."""
    if not len(t) or not np.isfinite(t).any():
        raise CisError(f"{path}: no request with a time in {time_col!r}; expected requests to measure")
    end = float(np.nanmax(t))
    span = end - float(np.nanmin(t))
    if span <= 0:
        raise CisError(f"{path}: every request arrived at {end:g} s; expected requests spread over time to measure "
                       "rates")
    if window is None:
        return np.isfinite(t), span, f"all requests, first to last arrival ({time_col})"
    if window > span:
        raise CisError(f"--window {window:g} is longer than {path}'s span ({span:g} s, first to last arrival in "
                       f"{time_col!r}); expected at most {span:g}, or no --window for all of it")
    return t >= end - window, window, f"requests that arrived in the last {window:g} s of the file ({time_col})"


def _walked(
    path: Path, spec: CisSpec, pairs: dict[tuple[str, str], dict[int, int]]
) -> tuple[dict[str, dict[int, int]], dict[str, int]]:
    """Served per node and exit, and forwarded per node, from the (entry, serving node) pairs' exit counts."""
    served: dict[str, dict[int, int]] = {i: {} for i in spec.ids}
    forwarded = {i: 0 for i in spec.ids}
    for (entry, node), per in pairs.items():
        way = [n.id for n in spec.path_to_root(entry)]
        if node not in way:
            raise CisError(f"{path}: requests entered at {entry!r} were served by {node!r}, which is not on its way "
                           f"to the root ({' -> '.join(way)}) in spec {spec.name!r}")
        for e, k in per.items():
            served[node][e] = served[node].get(e, 0) + k
        for hop in way[: way.index(node)]:
            forwarded[hop] += sum(per.values())
    return served, forwarded


# ---------------------------------------------------------------- the design updated


def rates_from(
    source: str, design: CisSpec, where: str, window: float | None = None, caps: bool = False
) -> tuple[Measurement, CisSpec]:
    """``--rates-from SOURCE``: the measurement, and the design with the measured arrival rates (and caps)."""
    m = measure(source, design, (), window)
    return m, update_spec(design, m, caps, where)


def update_spec(design: CisSpec, m: Measurement, caps: bool = False, where: str = "the design") -> CisSpec:
    """The design with the measured arrival rates (negative in-flight skew clipped to 0) and, with ``caps``,
    each node's transfer cap set to its measured transfer rate."""
    m.check_tree(design, where)
    rates = m.rates()
    nodes = []
    for n in design.nodes:
        arrival = round(max(0.0, rates.arrival_rate[n.id]), 6)
        cap = round(rates.transfer_rate[n.id], 6) if caps and n.parent is not None else n.max_transfer_rate
        nodes.append(replace(n, arrival_rate=arrival, max_transfer_rate=cap))
    return replace(design.replace_nodes(nodes), name=f"{design.name}-measured")


def updated_tables(updated: CisSpec, classes: bool = True) -> dict:
    """The updated spec's TOML tables; without ``classes`` (the design left it out: the data says) no
    ``classes`` key, as in the design."""
    tables = spec_to_dict(updated)
    if not classes:
        tables["cis"].pop("classes", None)
    return tables


def updated_spec_text(
    design: CisSpec, updated: CisSpec, m: Measurement, caps: bool, where: str, classes: bool = True
) -> str:
    """The updated spec as TOML, its header saying where every number came from; ``classes`` False: the
    design does not state its class count, so neither does the copy."""
    lines = [
        "# A CIS spec updated from a measurement ('cis spec update'; docs/closed-loop.md).",
        f"# arrival rates: measured from {m.source} ({m.kind}; {m.window}; {m.served} samples served in "
        f"{m.seconds:.3f} s)",
        "# transfer caps: " + ("the measured transfer rates (--caps)" if caps else f"as in {where}"),
        f"# {'node':<12}{'exit':>5}{'design arrival':>16}{'measured':>11}{'design cap':>12}{'cap':>11}",
    ]
    for d, u in zip(design.nodes, updated.nodes):
        lines.append(
            f"# {d.id:<12}{d.exit:>5}{d.arrival_rate:>16.3f}{u.arrival_rate:>11.3f}"
            f"{d.max_transfer_rate:>12.3f}{u.max_transfer_rate:>11.3f}"
        )
    return "\n".join(lines) + "\n\n" + tomli_w.dumps(updated_tables(updated, classes))
