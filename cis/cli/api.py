"""The Python API beside the command line: ``cis.train``, ``cis.export``, ``cis.serve``, ``cis.infer``.

    import cis

    run = cis.train(stages, (x, y), serving="60-30-10", rounds=10, optimizer="adamw", lr=1e-3)
    run.folder, run.cis_accuracy, run.exit_accuracy           # the run dir, test accuracies
    bundle = cis.export(run)                                   # per-stage ONNX, thresholds, profiles
    with cis.serve(bundle) as served:                          # the spec's nodes, in this process
        answers = cis.infer(served, x_test, y_test)
    answers.summary["accuracy"], answers.summary["served_share_per_exit"]

Each does what its command does (``cis train``, ``cis export``, ``cis serve --all``, ``cis infer``), through
the same code, and a mistake raises :class:`cis.core.errors.CisError` with the command's one line. This
module is the command layer's (the only layer that may import training, the exporter and the runtime
together); ``cis/__init__.py`` names its four functions lazily, so ``import cis`` stays light. What differs
from the command line: the model and the data may be Python objects.

- **The model** (``stages``): ``(body, head)`` pairs of torch modules or an ``EarlyExitNet`` (the contract of
  docs/your-model.md), or a factory callable, kept in this process by
  :mod:`cis.training.models.in_memory` (a run of them is exported in the process that trained it); or a
  reference ``"PATH.py:NAME"`` / ``"pkg.module:NAME"``, which rebuilds anywhere, as ``cis train --model``;
  or None, the method's built-in model.
- **The data**: a map-style dataset (``len(ds)``, ``ds[i] -> (x, y)``, e.g. a ``torch.utils.data.Dataset``)
  or a tuple ``(x, y)`` of arrays or tensors, with optional ``val_data`` and ``test_data`` of the same kinds
  (without them: a seeded 70/10/20 split); the samples are checked as ``--data`` checks them and written to
  ``RUN/data.npz``, which the run records, so ``cis evaluate`` and ``cis export`` read them from any process.
  Or a ``--data`` reference (``"digits"``, ``"my.npz"``, ``"photos/"``, ``"hf:DIR"``, ``"data.py:make"``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cis.core.errors import CisError

logger = logging.getLogger(__name__)

DATA_FILE = "data.npz"  # the run's in-memory data, written into its folder
SPEC_FILE = "given-spec.toml"  # a CisSpec object handed to cis.train, written into the run's folder
READY_SECONDS = 60.0  # cis.serve: how long a node may take to start and to hear its parent


@dataclass
class Run:
    """A finished run: its folder (the run dir of ``cis train``) and its ``summary.json``."""

    folder: Path
    summary: dict[str, Any]

    @property
    def cis_accuracy(self) -> float:
        """The CIS accuracy on the test split (quota thresholds at the spec's serving shares)."""
        return float(self.summary["cis_accuracy"])

    @property
    def exit_accuracy(self) -> dict[int, float]:
        """Each exit's accuracy on the test split: {exit: accuracy}."""
        return {int(e): float(a) for e, a in self.summary["test"]["exit_accuracy"].items()}

    def model(self) -> Any:
        """The trained model (an ``EarlyExitNet``), rebuilt from the run's checkpoint."""
        from cis.training.checkpoint import load_checkpoint

        return load_checkpoint(self.folder)[0]


def train(stages: Any, train_data: Any, *, spec: Any = None, val_data: Any = None, test_data: Any = None,
          classes: Sequence[str] | None = None, out: str | Path | None = None, progress: bool = False,
          **settings: Any) -> Run:
    """Train an early-exit model for a CIS, as ``cis train`` does; the finished :class:`Run`.

    ``stages``: the model (the module doc's kinds); ``train_data`` (and ``val_data``, ``test_data``): the data;
    ``classes``: class names for array data; ``spec``: a spec file or a ``CisSpec`` (default: ``topology``
    under ``serving``, two of the ``settings``); ``out``: the run dir (default: a new temporary folder);
    ``settings``: any field of ``cis.training.config.RunConfig`` (``rounds``, ``lr``, ``optimizer``,
    ``clip_grad_norm``, ``centralised``, ``seed``, ``device``, ``method``, ``model_args``, ...)."""
    from cis.core.paths import check_folder
    from cis.core.spec import CisSpec, write_spec

    _check_path(spec, "cis.train: spec", "a spec file (TOML) or a CisSpec", CisSpec)
    _check_path(out, "cis.train: out", "a folder for the run")
    _check_settings(settings)
    if out is not None:
        check_folder(out, "cis.train: out (the run dir)")
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="cis-run-"))
    made = not folder.exists() or not any(folder.iterdir())
    values = dict(settings)
    try:
        values.update(_model_settings(stages))
        values["dataset"] = _data_reference(folder, train_data, val_data, test_data, classes)
        if isinstance(spec, CisSpec):
            folder.mkdir(parents=True, exist_ok=True)
            write_spec(spec, folder / SPEC_FILE)
            spec = folder / SPEC_FILE
        if spec is not None:
            values["spec"] = str(Path(spec).resolve())
        summary = _train(folder, values, progress)
    except Exception:
        if made and not (folder / "checkpoint.pt").exists():  # a mistake leaves nothing; a checkpoint stays
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return Run(folder, summary)


def _check_path(value: Any, what: str, expected: str, *kinds: type) -> None:
    """One line unless ``value`` is None, a path (a str or a Path) or one of ``kinds``."""
    if value is not None and not isinstance(value, (str, Path, *kinds)):
        raise CisError(f"{what} is a {type(value).__name__} ({value!r:.60}); expected {expected}")


def _check_settings(settings: dict[str, Any]) -> None:
    """One line for a setting that is no field of RunConfig, naming the known ones."""
    import dataclasses
    import difflib

    from cis.training.config import RunConfig

    known = sorted(f.name for f in dataclasses.fields(RunConfig))
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CisError(f"cis.train: unknown setting {name!r}{hint}; expected a field of "
                           f"cis.training.config.RunConfig: {', '.join(known)}")  # fmt: skip


def _model_settings(stages: Any) -> dict[str, Any]:
    if stages is None:
        return {}
    if isinstance(stages, (str, Path)):
        from cis.training.models.model_ref import parse_reference

        return {"model": parse_reference(str(stages)).text}
    from cis.training.models.in_memory import REFERENCE, register

    return {"model": REFERENCE, "model_args": {"key": register(stages)}}


def _train(folder: Path, values: dict[str, Any], progress: bool) -> dict[str, Any]:
    from cis.training.config import make_config
    from cis.training.run import train_run

    return train_run(make_config({}, values), folder, progress=progress, log=logger.info)


def _data_reference(folder: Path, train_data: Any, val_data: Any, test_data: Any,
                    classes: Sequence[str] | None) -> str:
    """A ``--data`` reference as given (paths made absolute), or the Python data written to ``RUN/data.npz``."""
    from cis.training.data.data_ref import absolute_ref

    if isinstance(train_data, (str, Path)):
        if val_data is not None or test_data is not None or classes is not None:
            raise CisError("cis.train: val_data, test_data and classes go with data in memory, not a reference")
        return absolute_ref(str(train_data))
    if val_data is not None and test_data is None:
        raise CisError("cis.train: val_data without test_data; expected test_data too (or neither: a seeded split)")
    parts = [("train", train_data), ("val", val_data), ("test", test_data)]
    tables = [(code, _table(data, name)) for code, (name, data) in enumerate(parts) if data is not None]
    names = classes if classes is not None else tables[0][1][2]
    _check_parts([(parts[code][0], t[0], t[1]) for code, t in tables], names)
    arrays: dict[str, np.ndarray] = {
        "x": np.concatenate([t[0] for _, t in tables]), "y": np.concatenate([t[1] for _, t in tables]),
    }
    if len(tables) > 1:
        arrays["split"] = np.concatenate([np.full(len(t[1]), code, np.int64) for code, t in tables])
    if names is not None:
        arrays["classes"] = np.array([str(c) for c in names])
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / DATA_FILE, **arrays)  # type: ignore[arg-type]  # numpy's stubs take the names as options
    return str((folder / DATA_FILE).resolve())


def _table(data: Any, part: str) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """(x, y, class names or None) of a tuple ``(x, y)`` of arrays or tensors, or of a map-style dataset (its
    samples checked as a --data factory's are)."""
    if isinstance(data, Mapping) or not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise CisError(f"cis.train {part}_data: a {type(data).__name__}; expected a tuple (x, y) of arrays or tensors "
                       "(a dict's arrays as (d['x'], d['y'])), a map-style dataset (len(ds), ds[i] -> (x, y)) or a "
                       "--data reference (digits, FILE.npz, DIR, hf:DIR, PATH.py:FACTORY)")  # fmt: skip
    from cis.training.data.dataset import checked_labels, checked_x
    from cis.training.data.sources import materialise

    where = f"cis.train {part}_data"
    if isinstance(data, tuple) and not all(isinstance(d, (tuple, list)) and len(d) == 2 for d in data):
        if len(data) != 2 or not all(hasattr(a, "shape") for a in data):  # not samples, nor (x, y) of arrays
            kinds = ", ".join(type(a).__name__ for a in data[:4]) + (", ..." if len(data) > 4 else "")
            raise CisError(f"{where}: a tuple of {len(data)} ({kinds}); expected a tuple (x, y) of two arrays "
                           "or tensors (np.asarray(...) of lists) or a map-style dataset (len(ds), ds[i] -> (x, y))")
        x, y = (np.asarray(a.detach().cpu() if hasattr(a, "detach") else a) for a in data)
        names = None
    else:
        table = _named(materialise, data, where, part if part != "train" else "")
        x, y, names = table.x, table.y, table.classes
    x = _named(checked_x, x, where)
    return x, _named(checked_labels, y, len(x), where), names


def _named(check: Any, *args: Any) -> Any:
    """``check(*args)``, its one line naming the argument (``cis.train train_data: ...``), not ``data ...``."""
    try:
        return check(*args)
    except CisError as exc:
        raise CisError(str(exc).removeprefix("data ")) from None


def _check_parts(parts: list[tuple[str, np.ndarray, np.ndarray]], names: Sequence[str] | None) -> None:
    """Across the parts (name, x, y): one sample shape, labels below the class names' count, two classes present."""
    from cis.training.data.dataset import check_classes_present

    for part, x, y in parts:
        if x.shape[1:] != parts[0][1].shape[1:]:
            raise CisError(f"cis.train {part}_data: samples of shape {x.shape[1:]}, {parts[0][0]}_data's "
                           f"{parts[0][1].shape[1:]}; expected one shape")  # fmt: skip
        if names is not None and int(y.max()) >= len(names):
            i = int(np.argmax(y >= len(names)))
            raise CisError(f"cis.train {part}_data: sample {i} has label {int(y[i])}; expected labels "
                           f"0..{len(names) - 1} ({len(names)} class names)")  # fmt: skip
    where = "cis.train " + ", ".join(f"{part}_data" for part, _, _ in parts)
    _named(check_classes_present, np.concatenate([y for _, _, y in parts]), where)


def export(run: Run | str | Path, out: str | Path | None = None, **options: Any) -> Path:
    """Cut a run into a bundle, as ``cis export RUN --out OUT`` does; the bundle's folder (default: the run's
    folder and ``-bundle``). ``options``: ``cis.exporter.bundle_writer.export_bundle``'s (``spec``,
    ``feature_dtype``, ``latency_repeats``, ...)."""
    from cis.exporter.bundle_writer import export_bundle

    _check_path(run, "cis.export: run", "a Run (what cis.train returned) or a run dir", Run)
    folder = run.folder if isinstance(run, Run) else Path(run)
    target = Path(out) if out is not None else folder.with_name(folder.name + "-bundle")
    export_bundle(folder, target, **options)
    return target


class Served:
    """The nodes of a spec serving a bundle in this process (one thread each), on free loopback ports, every
    node hearing its parent: ``addresses`` ({node: address}); ``leaves``, the nodes requests enter at;
    ``nodes`` ({node: cis.runtime.node.Node}). A context manager: leaving it stops every node."""

    def __init__(self, bundle: str | Path, spec: Any = None, **node_options: Any) -> None:
        from cis.core.bundle import load_bundle
        from cis.core.spec import CisSpec, load_spec
        from cis.runtime.factory import build_node
        from cis.runtime.launcher import plan_addresses

        _check_path(bundle, "cis.serve: bundle", "a bundle folder (what cis.export returned)")
        _check_path(spec, "cis.serve: spec", "a spec file (TOML) or a CisSpec", CisSpec)
        _check_node_options(node_options)
        loaded = load_bundle(bundle)
        chosen = load_spec(spec) if isinstance(spec, (str, Path)) else (spec or loaded.spec)
        if chosen is None:
            raise CisError(f"cis.serve: {loaded.root} has no spec; pass spec=SPEC")
        self.spec = chosen
        self.addresses = plan_addresses(self.spec, free_ports=True)
        self.leaves = [n.id for n in self.spec.leaves]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.nodes: dict[str, Any] = {}  # node id -> its cis.runtime.node.Node
        try:
            for n in self.spec.bottom_up()[::-1]:  # parents first: children find them up
                parent = self.addresses[n.parent] if n.parent else None
                self.nodes[n.id] = build_node(loaded, n.id, self.spec, bind=self.addresses[n.id], parent=parent,
                                              **node_options)
                self._start(n.id)
        except BaseException:  # a node that cannot be built: the ones started stop
            self.close()
            raise
        self._wait_for_parents(READY_SECONDS)

    def _start(self, node_id: str) -> None:
        ready = threading.Event()
        thread = threading.Thread(target=self.nodes[node_id].run, name=f"cis-{node_id}", daemon=True,
                                  kwargs={"install_signals": False, "ready": ready.set, "stop": self._stop.is_set})
        thread.start()
        self._threads.append(thread)
        if not ready.wait(READY_SECONDS):
            self.close()
            raise CisError(f"cis.serve: node {node_id} did not start within {READY_SECONDS:.0f} s")

    def _wait_for_parents(self, seconds: float) -> None:
        """Until every node hears its parent (else its first requests would be answered degraded, below)."""
        end = time.monotonic() + seconds
        waiting = [n for n in self.nodes.values() if n.cfg.parent is not None]
        while any(not n.parent_up for n in waiting):
            if time.monotonic() > end:
                self.close()
                late = [n.cfg.node_id for n in waiting if not n.parent_up]
                raise CisError(f"cis.serve: {', '.join(late)} heard no parent within {seconds:.0f} s")
            time.sleep(0.02)

    def close(self) -> None:
        """Stop every node (each drains what it holds) and wait for them."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_node_options(options: dict[str, Any]) -> None:
    """Before any node starts: a TypeError for an option no node takes (as Python's for an unknown keyword), one
    line for a provider that is none."""
    import dataclasses
    import inspect

    from cis.core.spec import PROVIDERS
    from cis.runtime.factory import build_node
    from cis.runtime.node_config import NodeConfig

    known = {*inspect.signature(build_node).parameters, *(f.name for f in dataclasses.fields(NodeConfig)),
             "provider", "threads"}  # fmt: skip
    for name in options:
        if name not in known:
            raise TypeError(f"cis.serve() got an unexpected keyword argument {name!r}; expected an option of "
                            "cis.runtime.factory.build_node or a field of cis.runtime.node_config.NodeConfig")
    provider = options.get("provider")
    if provider is not None and provider not in PROVIDERS:
        raise CisError(f"cis.serve: provider {provider!r}; expected one of {', '.join(PROVIDERS)}")


def serve(bundle: str | Path, spec: Any = None, **node_options: Any) -> Served:
    """Serve a bundle with every node of its spec (or ``spec``: a file or a ``CisSpec``) in this process, for
    tests and notebooks; use it as a context manager. ``node_options``: ``cis.runtime.factory.build_node``'s
    (``provider``, ``threshold``, ``transfer_cap``, ``max_batch``, ...)."""
    return Served(bundle, spec, **node_options)


@dataclass
class Answers:
    """What :func:`infer` got back: ``summary`` (the ``cis infer --json`` result: accuracy, served shares,
    latency, errors with their messages, capped per node) and ``results`` (one ``cis.runtime.client.Result``
    per request, in order)."""

    summary: dict[str, Any]
    results: list[Any]


def infer(target: Served | str, x: Any, y: Any = None, *, node: str | None = None, batch_size: int = 1,
          window: int = 32, rate: float | None = None, timeout: float = 30.0) -> Answers:
    """Send the samples ``x`` (an array or tensor, (N, ...) in the model's input dtype) to a node, as
    ``cis infer --connect`` does; ``y``: labels, for the accuracy. ``target``: a node's address, or what
    :func:`serve` returned (then ``node``, default its first leaf, names the entry node)."""
    from cis.runtime.client import Client
    from cis.runtime.result_summary import summarize

    if isinstance(target, Served):
        if target._stop.is_set():
            raise CisError("cis.infer: its cis.serve(...) nodes are stopped (the with block ended or close() was "
                           "called); expected served nodes (infer inside the with block)")  # fmt: skip
        entry = node or target.leaves[0]
        if entry not in target.addresses:
            raise CisError(f"cis.infer: no node {entry!r}; expected one of {', '.join(target.addresses)}")
        address = target.addresses[entry]
    else:
        address = str(target)
    samples = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
    if samples.ndim == 0 or samples.dtype.kind not in "biuf":
        raise CisError(f"cis.infer: x is a {type(x).__name__} of dtype {samples.dtype} and shape {samples.shape}; "
                       "expected an array or tensor of samples (N, ...) of numbers")  # fmt: skip
    labels = None if y is None else _labels(y)
    if labels is not None and (labels.ndim != 1 or len(labels) != len(samples)):
        raise CisError(f"cis.infer: y has shape {labels.shape} for {len(samples)} samples in x; expected one label "
                       "per sample")  # fmt: skip
    with Client(address, timeout=timeout) as client:
        results = client.infer_many(samples, batch_size=batch_size, window=window, rate=rate, timeout=timeout)
    return Answers(summarize(results, labels), list(results))


def _labels(y: Any) -> np.ndarray:
    """``y`` as int64 labels, or one line for labels that are not whole numbers (text, fractions, NaN)."""
    given = np.asarray(y.detach().cpu() if hasattr(y, "detach") else y)
    if given.dtype.kind in "biu":
        return given.astype(np.int64)
    whole = given.dtype.kind == "f" and bool(np.all(np.isfinite(given))) and bool(np.all(given == np.round(given)))
    if not whole:
        raise CisError(f"cis.infer: y has dtype {given.dtype} ({given.ravel()[:3].tolist()!r:.60}...); expected "
                       "class indices (whole numbers)")  # fmt: skip
    return given.astype(np.int64)
