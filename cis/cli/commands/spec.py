"""``cis spec new``: write a spec for a built-in topology and serving setting;
``cis spec update DESIGN --rates-from SOURCE``: the design with the arrival rates a running CIS measured.

The class count of a new spec: ``--classes K``, or ``--data REF`` (the data's, read as ``cis train --data REF``
reads it; the 'train' extra), or neither: the spec then sets no ``classes`` and ``cis train --spec`` takes the
count from its data (anything else that reads the spec sees the default, 10)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import tomli_w

from cis.cli.main import print_result
from cis.core.errors import CisError
from cis.core.spec import load_spec, spec_to_dict
from cis.core.topologies import DEFAULT_TOTAL_RATE, TOPOLOGIES, make_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spec", help="make CIS spec files")
    specsub = p.add_subparsers(dest="spec_command", metavar="ACTION")
    specsub.required = True
    new = specsub.add_parser("new", help="write a spec for a built-in topology")
    new.add_argument("--topology", default="paper-7", choices=sorted(TOPOLOGIES))
    new.add_argument("--serving", default="80-15-5", help="share served at exits 1-2-3, e.g. 80-15-5")
    new.add_argument("--total-rate", type=float, default=DEFAULT_TOTAL_RATE, help="requests/s arriving over all leaves")
    count = new.add_mutually_exclusive_group()
    count.add_argument("--classes", type=int, help="the number of classes (default: none in the spec, so cis train "
                       "takes it from its --data)")
    count.add_argument("--data", metavar="REF", help="take the number of classes from this data (what cis train "
                       "--data takes: PATH.npz, DIR, hf:DIR, PATH.py:FACTORY, digits, ...; the 'train' extra)")
    new.add_argument("-o", "--out", help="file to write (default: print to stdout)")
    new.add_argument("--json", action="store_true", help="print the spec as JSON")
    new.set_defaults(func=run)
    up = specsub.add_parser(
        "update", help="the design spec with the arrival rates (and, with --caps, transfer caps) a CIS measured"
    )
    up.add_argument("design", help="the spec the CIS was designed with (TOML)")
    up.add_argument(
        "--rates-from", required=True, metavar="SOURCE", help="where to measure: a spec (its live nodes), a "
        "'cis serve --all' log folder, a requests file (.csv) or a saved measurement (.json); docs/closed-loop.md"
    )
    up.add_argument(
        "--window", type=float, metavar="SECONDS", help="live: two snapshots SECONDS apart (default: since the nodes "
        "started); a requests file: its last SECONDS (default: all of it)"
    )
    up.add_argument("--caps", action="store_true", help="also set each node's max_transfer_rate to its measured "
                    "transfer rate (default: keep the design's caps)")
    up.add_argument("-o", "--out", help="file to write (default: print to stdout)")
    up.add_argument("--json", action="store_true", help="print the spec and the measurement as JSON")
    up.set_defaults(func=run_update)


def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.total_rate) and args.total_rate >= 0):
        raise CisError(f"--total-rate is {args.total_rate}; expected requests per second >= 0")
    if args.classes is not None and args.classes < 2:
        raise CisError(f"--classes is {args.classes}; expected at least 2 classes")
    _check_out(args.out)
    classes = data_classes(args.data) if args.data else args.classes
    spec = make_spec(args.topology, args.serving, args.total_rate, **({"num_classes": classes} if classes else {}))
    tables = spec_to_dict(spec)
    if classes is None:  # the data says: cis train --spec takes the count from its --data
        del tables["cis"]["classes"]
    said = f"{classes} classes" + (f" from {args.data}" if args.data else "") if classes else "classes from the data"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # as every --out of cis makes its folder
        Path(args.out).write_text(tomli_w.dumps(tables))
        print_result(
            args,
            {"written": args.out, "spec": tables},
            f"wrote {args.out} ({args.topology}, serving {args.serving}, {said})",
        )
    else:
        print_result(args, tables, tomli_w.dumps(tables).rstrip())
    return 0


def data_classes(ref: str) -> int:
    """The number of classes of the data ``ref`` (loaded and checked as cis train loads it)."""
    from cis.core.extras import require

    require("train", f"--data {ref}")
    from cis.training.data.data_ref import absolute_ref
    from cis.training.data.loading import load_dataset

    return load_dataset(absolute_ref(ref)).train.num_classes


def run_update(args: argparse.Namespace) -> int:
    from cis.core.rates import compute_rates
    from cis.core.spec import states_classes
    from cis.runtime.measure import rates_from, updated_spec_text, updated_tables

    _check_out(args.out)
    if not args.rates_from.strip():
        raise CisError(f"--rates-from is empty ({args.rates_from!r}); expected a spec (.toml), a log folder of "
                       "'cis serve --all', a requests file (.csv) or a saved measurement (.json)")
    if args.out and _same_file(args.out, args.design):  # before anything is measured or written
        raise CisError(f"-o {args.out} is the design {args.design} itself, which cis spec update leaves as it is; "
                       "expected another file (e.g. -o design-measured.toml)")
    design = load_spec(args.design)
    m, updated = rates_from(args.rates_from, design, args.design, args.window, args.caps)
    classes = states_classes(args.design)  # a design without classes takes them from the data; so does its copy
    text = updated_spec_text(design, updated, m, args.caps, args.design, classes)
    result = {"written": args.out, "spec": updated_tables(updated, classes), **m.to_json()}
    if not args.out:
        print_result(args, result, text.rstrip())
        return 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    shares = compute_rates(updated).exit_share
    print_result(
        args,
        result,
        f"wrote {args.out}: arrival rates measured from {m.source} ({m.served} samples in {m.seconds:.1f} s)"
        + (", caps measured" if args.caps else "")
        + "; its calculus serves "
        + "-".join(f"{100 * s:.1f}" for s in shares.values())
        + " % at the exits",
    )
    return 0


def _check_out(out: str | None) -> None:
    """``-o FILE``: a path to a file (None: stdout); an empty one or a folder is one line."""
    if out is None:
        return
    if not out.strip():
        raise CisError(f"-o is empty ({out!r}); expected a file to write the spec to (leave -o out for stdout)")
    if Path(out).is_dir():
        raise CisError(f"-o {out} is a folder; expected a file to write the spec to "
                       f"(e.g. -o {Path(out) / 'spec.toml'})")


def _same_file(a: str, b: str) -> bool:
    """Whether the paths name one file: the same path once resolved, or one file under two names (a link)."""
    pa, pb = Path(a), Path(b)
    if pa.resolve() == pb.resolve():
        return True
    try:
        return pa.samefile(pb)
    except OSError:  # the output does not exist yet
        return False
