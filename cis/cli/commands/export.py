"""``cis export RUN_DIR --out BUNDLE``: cut a trained model into per-tier stages and write a bundle.

Needs torch and onnx; they are imported inside ``run`` so the rest of the CLI
starts without them. See docs/export.md.
"""

from __future__ import annotations

import argparse
import logging

from cis.cli.interrupt import sigterm_as_interrupt
from cis.cli.main import print_result
from cis.core.errors import CisError
from cis.core.spec import load_spec

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="cut a trained model into stages (ONNX, optional TensorRT) and write a bundle")
    p.add_argument("run_dir", help="run folder with checkpoint.pt and checkpoint.json (from 'cis train')")
    p.add_argument("--out", required=True, help="bundle folder to write (replaced when it already holds a bundle)")
    p.add_argument(
        "--spec", help="CIS spec (TOML) to calibrate thresholds for (default: the spec stored in the checkpoint); "
        "with --rates-from: the design the measured rates update"
    )
    p.add_argument(
        "--rates-from", metavar="SOURCE", help="calibrate each node's threshold to the rates a running CIS measured "
        "(a spec: its live nodes; a 'cis serve --all' log folder; a requests file; a saved measurement) and report "
        "how far the design's thresholds were off; the bundle's spec gets the measured arrival rates "
        "(docs/closed-loop.md)"
    )
    p.add_argument(
        "--window", type=float, metavar="SECONDS", help="with --rates-from: live, two snapshots SECONDS apart "
        "(default: since the nodes started); a requests file, its last SECONDS (default: all of it)"
    )
    p.add_argument(
        "--opset", type=int, help="ONNX opset, >= 17 (default 17; the dynamo exporter writes 18 or newer, its "
        "default 18; a lower --opset with it is refused)"
    )
    p.add_argument(
        "--feature-dtype",
        choices=["fp32", "fp16", "int8"],
        default="fp32",
        help="dtype of the carries forwarded between nodes",
    )
    p.add_argument(
        "--exporter",
        choices=["auto", "torchscript", "dynamo"],
        default="auto",
        help="torch ONNX exporter (default: auto)",
    )
    p.add_argument(
        "--trt", action="store_true", help="also build a TensorRT engine per stage (needs TensorRT and an NVIDIA GPU)"
    )
    p.add_argument("--trt-fp32", action="store_true", help="build the TensorRT engines in FP32 instead of FP16")
    p.add_argument(
        "--patience",
        type=int,
        help="FLAME models: inference patience p_ev of the bundle's patience policy (default: 4)",
    )
    p.add_argument(
        "--latency-repeats", type=int, default=20,
        help="timed runs per stage and batch size for the latency profile, >= 1 (default 20)",
    )
    p.add_argument(
        "--sign", metavar="KEYFILE", help="Ed25519 private key (PEM): sign the finished bundle's manifest "
        "(manifest.sig)"
    )
    p.add_argument(
        "--allow-model-change", action="store_true",
        help="rebuild a user model whose file changed since the run (default: one line, exit 2)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _progress(msg: str) -> None:
    log.info("cis export: %s", msg)  # the prefix as before logging, which scripts may grep for


def run(args: argparse.Namespace) -> int:
    from cis.core.bundle import sign_bundle
    from cis.core.signing import load_private_key

    if args.sign:
        load_private_key(args.sign)  # a bad key fails now, not after minutes of export
    if args.window is not None and not args.rates_from:
        raise CisError("--window goes with --rates-from SOURCE")
    recalibration, spec = (_recalibration(args) if args.rates_from else (None, args.spec))
    from cis.exporter.bundle_writer import export_bundle

    restore = sigterm_as_interrupt()  # a SIGTERM also removes the half-written bundle's temporary folder
    try:
        report = export_bundle(
            args.run_dir,
            args.out,
            spec=spec,
            recalibration=recalibration,
            feature_dtype=args.feature_dtype,
            opset=args.opset,
            trt=args.trt,
            trt_fp16=not args.trt_fp32,
            exporter=args.exporter,
            latency_repeats=args.latency_repeats,
            patience=args.patience,
            progress=_progress,
            allow_model_change=args.allow_model_change,
        )
    finally:
        restore()
    if args.sign:
        report["signature"] = str(sign_bundle(args.out, args.sign))
    print_result(args, report, summary(report))
    return 0


def _recalibration(args: argparse.Namespace):
    """--rates-from: (what the exporter recalibrates to, the design updated with the measured arrival rates)."""
    from cis.exporter.recalibration import Recalibration
    from cis.runtime.measure import rates_from
    from cis.training.checkpoint import read_meta, run_spec

    if args.spec is not None:
        design, where = load_spec(args.spec), args.spec
    else:
        meta, meta_path = read_meta(args.run_dir)
        design, where = run_spec(meta, meta_path), f"{meta_path} (its spec)"
    m, updated = rates_from(args.rates_from, design, where, args.window)
    return Recalibration(m.rates(), design, m.to_json()["measurement"]), updated


def _acc_cell(d: dict, e: str, base: bool) -> str:
    cell = f"{d['val_accuracy'][e] * 100:.2f}"
    if not base:
        cell += f" ({d['val_accuracy_change'][e] * 100:+.2f})"
    return cell.rjust(16)


def summary(report: dict) -> str:
    v = report["verification"]
    cal = report["calibration"]
    lines = [
        f"bundle {report['bundle']}: {report['stages']} stages, opset {report['opset']} ({report['exporter']}), "
        f"carries {report['feature_dtype']}",
        f"verified with onnxruntime: max abs diff {v['max_abs_diff']:.2e} (stage vs torch and chain vs full model, "
        "batches "
        + ", ".join(str(b["size"]) for b in v["batches"].values())
        + f"; limit {v['atol']:g})",
        "",
        f"{'carries':<9}"
        + "".join(f"{'val acc@' + e:>16}" for e in report["feature_dtypes"]["fp32"]["val_accuracy"])
        + "   bytes forwarded per request",
    ]
    for name, d in report["feature_dtypes"].items():
        accs = "".join(_acc_cell(d, e, name == "fp32") for e in d["val_accuracy"])
        fwd = ", ".join(f"after exit {e}: {b}" for e, b in d["bytes_per_forwarded_request"].items())
        lines.append(f"{name + (' *' if name == report['feature_dtype'] else ''):<9}{accs}   {fwd}")
    lines += ["", f"{'node':<10}{'exit':>5}{'threshold':>11}"]
    for nid, n in report["nodes"].items():
        t = n["threshold"]
        lines.append(
            f"{nid:<10}{n['exit']:>5}{t if isinstance(t, str) else ('-' if t is None else format(t, '.4f')):>11}"
        )
    shares = "  ".join(
        f"exit {e}: {cal['achieved_share_per_exit'][e] * 100:.1f}% (target {s * 100:.1f}%)"
        for e, s in cal["target_share_per_exit"].items()
    )
    lines += [
        "",
        f"served on validation ({cal['samples']} samples): {shares}",
        f"CIS accuracy on validation: {cal['cis_accuracy'] * 100:.2f}%",
    ]
    lat = report["latency"]
    lines.append("latency (onnxruntime, ms per call at batch " + "/".join(next(iter(lat.values()))) + "): " + "  ".join(
        f"stage {k}: " + "/".join(f"{s * 1e3:.3f}" for s in v.values()) for k, v in lat.items()
    ))
    if cal.get("rates_from"):
        from cis.exporter.recalibration import summary_lines

        lines += summary_lines(cal)
    if report.get("signature"):
        lines.append(f"signed: {report['signature']} (serve with --trust and the matching public key)")
    if report.get("tensorrt"):
        lines.append(f"TensorRT engines ({report['tensorrt']['precision']}) built and verified against onnxruntime")
    return "\n".join(lines)
