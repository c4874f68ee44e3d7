"""``cis inspect BUNDLE``: show what a bundle holds (verifies every file's sha256; no torch)."""

from __future__ import annotations

import argparse
import json

from cis.cli.main import print_result
from cis.core.bundle import MANIFEST, Bundle, load_bundle
from cis.core.errors import CisError, error_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show a bundle's manifest (stages, nodes, thresholds), verifying its files")
    p.add_argument("bundle", help="bundle folder (written by 'cis export')")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=run)


def _shape(t: dict) -> str:
    return "x".join("N" if d is None else str(d) for d in t["shape"])


def _tensor(t: dict) -> str:
    q = f" scale={t['scale']:.4g} zp={t['zero_point']}" if t.get("scale") is not None else ""
    return f"{t['name']} {t['dtype']}[{_shape(t)}]{q}"


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def run(args: argparse.Namespace) -> int:
    bundle = load_bundle(args.bundle)  # checks the fields nodes read (cis.core.manifest_checks)
    m = bundle.manifest
    try:
        lines = _header(bundle, m) + _stages(m) + _nodes(m) + _carries(m) + _made(m)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # a hand-edited descriptive field
        raise CisError(f"{bundle.root / MANIFEST}: cannot show it ({error_line(exc)}); expected the fields "
                       "docs/bundle.md describes") from None
    print_result(args, {"id": bundle.id, **m}, "\n".join(lines))  # id: what nodes name it by on the wire
    return 0


def _made(m: dict) -> list[str]:
    """How the bundle was checked against torch, and what made it."""
    lines = []
    ver = m.get("verification")
    if ver:
        lines.append(
            f"verified: max abs diff {ver.get('max_abs_diff', float('nan')):.2e} vs torch (limit {ver.get('atol')})"
        )
    if m.get("versions"):
        lines.append("made with " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    return lines


def _header(bundle: Bundle, m: dict) -> list[str]:
    """The bundle, its model, its input and its carries."""
    model = m.get("model", {})
    if "reference" in model:  # a user's model (docs/your-model.md)
        what = f"{model['reference']} args {json.dumps(model.get('args', {}))}"
    else:
        what = f"{model.get('arch', '?')} exits {model.get('exits')} width {model.get('width')}"
    inputs = "; ".join(
        f"{t['name']} {t['dtype']} {t['shape']} preprocessing {t.get('preprocessing', {}).get('kind', '?')}"
        for t in m.get("inputs", [])
    )
    return [
        f"bundle {bundle.root} id {bundle.id} (schema {m['schema_version']}, {len(m['files'])} files, sha256 verified)",
        f"model   {what} classes {len(m.get('classes', []))}; method {m.get('method', '?')}",
        (f"input   {inputs}; " if inputs else "input   ")
        + f"normalisation mean {(m.get('normalisation') or {}).get('mean')} "
        f"std {(m.get('normalisation') or {}).get('std')}",
        f"carries {bundle.feature_dtype}; opset {m.get('opset', '?')} ({m.get('exporter', '?')})",
    ]


def _stages(m: dict) -> list[str]:
    lines = ["", "stages:"]
    for s in m["stages"]:
        lines.append(
            f"  {s['index']} exit {s['exit']}  {s['file']}  {_count(s.get('bytes', 0))}B "
            f" {_count(s.get('flops', 0))}FLOPs  {_count(s.get('params', 0))} params"
            + (f"  engine {s['engine']}" if s.get("engine") else "")
        )
        lines.append(f"      in:  {', '.join(_tensor(t) for t in s['inputs'])}")
        lines.append(f"      out: {', '.join(_tensor(t) for t in s['outputs'])}")
    return lines


def _nodes(m: dict) -> list[str]:
    """The nodes with their thresholds, and the calibration's served shares."""
    if not m.get("nodes"):
        return []
    measure = (m.get("policy") or {}).get("measure", "?")
    lines = ["", f"nodes (confidence: {measure}):", f"  {'id':<10}{'exit':>5}{'stages':>10}{'threshold':>11}"]
    for nid, n in m["nodes"].items():
        t = n.get("threshold")
        lines.append(
            f"  {nid:<10}{n.get('exit', '?'):>5}{','.join(map(str, n['stages'])):>10}"
            f"{t if isinstance(t, str) else ('-' if t is None else format(t, '.4f')):>11}"
        )
    cal = m.get("calibration")
    if cal:
        shares = ", ".join(
            f"{e}: {cal['achieved_share_per_exit'][e] * 100:.1f}%/{v * 100:.1f}%"
            for e, v in cal["target_share_per_exit"].items()
        )
        lines.append(
            f"  served share per exit on validation (achieved/target): {shares}; CIS "
            f"accuracy {cal['cis_accuracy'] * 100:.2f}%"
        )
    return lines


def _carries(m: dict) -> list[str]:
    fd = m.get("feature_dtypes")
    if not fd:
        return []
    lines = ["", "carry dtypes (validation accuracy per exit; bytes forwarded per request):"]
    for name, d in fd.items():
        acc = " ".join(f"{v * 100:.2f}" for v in d["val_accuracy"].values())
        fwd = " ".join(str(b) for b in d["bytes_per_forwarded_request"].values())
        lines.append(f"  {name:<5} acc {acc}  bytes {fwd}")
    return lines

