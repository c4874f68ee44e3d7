"""Export one stage of a :class:`~cis.training.models.stage_plan.StagePlan` to a static ONNX graph.

Two torch exporters exist in torch 2.x; both give the same clean graphs for the
models here (Conv/Relu/pooling/Gemm, BatchNorm folded, no If or Loop):

- ``torchscript`` (``torch.onnx.export(..., dynamo=False)``): fast (well under
  a second per stage) and honours opset 17; deprecated upstream but present in
  torch 2.13. The default while it exists.
- ``dynamo`` (``torch.export`` + onnxscript): the upstream default since torch
  2.9; needs opset 18 or newer (it refuses to down-convert) and takes a few
  seconds per stage.

``auto`` picks torchscript when the installed torch still has it. Either way
the batch dimension of every input and output is dynamic (named ``batch``)
and every other dimension is static; :func:`check_graph` proves it.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import re
import sys
import warnings
from typing import Any

import onnx
import torch

from cis.core.bundle import TensorInfo
from cis.core.errors import CisError, error_line
from cis.training.models.stage_plan import ExportStage

EXPORTERS = ("auto", "torchscript", "dynamo")
MIN_OPSET = 17
DYNAMO_MIN_OPSET = 18
BATCH = "batch"
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}

_ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool",
}


class ExportError(CisError):
    """The torch-to-ONNX conversion failed or produced a graph we cannot serve."""


def resolve_exporter(exporter: str, opset: int | None, strict: bool = False) -> tuple[str, int]:
    """The exporter to use and the opset it will write (``opset`` None: the exporter's lowest, 17 or 18). The
    dynamo exporter writes opset 18 or newer: a lower ``opset`` is raised to 18, or refused with ``strict``
    (``cis export --opset``, :func:`cis.exporter.bundle_writer.export_bundle`: an opset asked for is the one
    written)."""
    if exporter not in EXPORTERS:
        raise CisError(f"exporter {exporter!r}: unknown; expected one of {', '.join(EXPORTERS)}")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET):
        raise CisError(f"opset {opset!r}: expected an integer >= {MIN_OPSET}")
    chosen = exporter
    if exporter == "auto":
        chosen = "torchscript" if _has_torchscript_exporter() else "dynamo"
    if chosen != "dynamo":
        return chosen, MIN_OPSET if opset is None else opset
    if strict and opset is not None and opset < DYNAMO_MIN_OPSET:
        how = "the dynamo exporter"
        if exporter == "auto":
            how = "auto picks the dynamo exporter (this torch has no other), which"
        raise CisError(
            f"--opset {opset}: {how} writes opset {DYNAMO_MIN_OPSET} or newer; expected --opset >= {DYNAMO_MIN_OPSET} "
            f"(or no --opset) with it, or --exporter torchscript for opset {opset}"
        )
    return chosen, DYNAMO_MIN_OPSET if opset is None else max(opset, DYNAMO_MIN_OPSET)


def _has_torchscript_exporter() -> bool:
    try:
        import torch.onnx.utils  # noqa: F401  (the legacy exporter's home)
    except ImportError:
        return False
    return hasattr(torch.onnx, "export")


@contextlib.contextmanager
def _quiet():
    """The exporters print progress, deprecation chatter and the graph a failure happened in; keep stdout clean
    for --json and stderr to the one line a failure gives (:func:`export_failure`)."""
    quiet_out, quiet_err = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
    with warnings.catch_warnings(), quiet_out, quiet_err:
        warnings.simplefilter("ignore")
        import logging

        loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            with _stdout_fd_silenced():
                yield
        finally:
            for lg, lv in zip(loggers, levels):
                lg.setLevel(lv)


@contextlib.contextmanager
def _stdout_fd_silenced():
    """File descriptor 1 to /dev/null: the torchscript exporter's C++ log prints the whole graph a failure
    happened in there, past ``sys.stdout``, and turns itself on whatever was set (torch 2.13's
    ``setup_onnx_logging`` tests the function ``_jit_is_onnx_log_enabled``, not its value)."""
    libc = ctypes.CDLL(None) if os.name == "posix" else None
    if sys.__stdout__ is not None:
        sys.__stdout__.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        if libc is not None:
            libc.fflush(None)  # C stdio's buffer still holds what the log wrote: to /dev/null with it
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def _traceable():
    """nn.MultiheadAttention's inference fast path (one fused kernel, no ONNX operator) off while exporting:
    a torchvision or timm ViT then exports as plain matrix products."""
    mha: Any = getattr(torch.backends, "mha", None)
    was = bool(mha.get_fastpath_enabled()) if mha is not None else False
    if was:
        mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        if was:
            mha.set_fastpath_enabled(True)


def export_stage(
    stage: ExportStage, example: tuple[torch.Tensor, ...], opset: int | None = MIN_OPSET, exporter: str = "auto"
) -> onnx.ModelProto:
    """Trace ``stage.module`` on ``example`` and return its ONNX model (checked)."""
    exporter, opset = resolve_exporter(exporter, opset)
    module = stage.module.eval()
    names_in, names_out = list(stage.inputs), list(stage.outputs)
    try:
        with _quiet(), _traceable(), torch.no_grad():
            if exporter == "torchscript":
                buf = io.BytesIO()
                axes = {n: {0: BATCH} for n in names_in + names_out}
                torch.onnx.export(
                    module,
                    example,
                    buf,  # type: ignore[arg-type]  # the torchscript exporter writes to any file object
                    input_names=names_in,
                    output_names=names_out,
                    dynamic_axes=axes,
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
                model = onnx.load_from_string(buf.getvalue())
            else:
                batch = torch.export.Dim(BATCH, min=1, max=65536)
                program = torch.onnx.export(
                    module,
                    example,
                    input_names=names_in,
                    output_names=names_out,
                    dynamic_shapes=tuple({0: batch} for _ in names_in),
                    opset_version=opset,
                    dynamo=True,
                    verbose=False,
                    optimize=True,
                )
                assert program is not None  # dynamo=True returns the program
                model = program.model_proto
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(export_failure(stage.index, exporter, opset, exc)) from None
    model.producer_name = "cis export"
    _fill_static_output_dims(model)
    check_graph(model, stage, opset)
    return model


_OPERATOR = re.compile(r"\b([a-z_]+::[A-Za-z_][\w.]*)")


def export_failure(index: int, exporter: str, opset: int, exc: BaseException) -> str:
    """One line for a stage the exporter cannot convert: the stage, and the operator where the error names one
    (``aten::cummax``), else the error's first line."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if "operator" in ln.lower()] or text.splitlines()[:1]
    op = next((m.group(1) for ln in lines for m in [_OPERATOR.search(ln)] if m), None)
    if op is not None:
        return (
            f"stage {index}: cannot be exported to ONNX: operator {op} is not supported ({exporter} exporter, opset "
            f"{opset}; {type(exc).__name__}); expected a stage whose operators ONNX has: rewrite it without {op}"
        )
    return f"stage {index}: {exporter} ONNX export failed ({error_line(exc)})"


def _fill_static_output_dims(model: onnx.ModelProto) -> None:
    """Write the sizes ONNX shape inference proves into output dims the exporter left symbolic.

    The torchscript exporter's own shape pass gives up on some graphs whose
    shapes are in fact static (e.g. Concat / Slice after a Conv in a ViT patch
    embedding) and names such dims (``Concattokens_1_dim_1``); ONNX's inference
    with data propagation resolves them. Only non-batch dims are touched, and
    only where inference found a number, so a truly dynamic dim still fails
    :func:`check_graph`.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is best effort; check_graph judges the result
        return
    found = {vi.name: vi.type.tensor_type.shape.dim for vi in inferred.graph.output}
    for vi in model.graph.output:
        dims = vi.type.tensor_type.shape.dim
        new = found.get(vi.name)
        if new is None or len(new) != len(dims):
            continue
        for d, n in list(zip(dims, new))[1:]:
            if not d.dim_value and n.dim_value:
                d.dim_value = n.dim_value


def check_graph(model: onnx.ModelProto, stage: ExportStage, opset: int | None = None) -> None:
    """Static graph, named inputs/outputs as planned, a dynamic batch dimension and nothing else dynamic."""
    where = f"stage {stage.index}"
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{where}: the ONNX graph is invalid ({str(exc).splitlines()[0]})") from None
    flow = sorted(
        {
            n.op_type
            for n in model.graph.node
            if n.op_type in CONTROL_FLOW
            or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
        }
    )
    if flow:
        raise ExportError(
            f"{where}: the graph has data-dependent control flow ({', '.join(flow)}); expected a static graph"
        )
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version < MIN_OPSET:
        raise ExportError(f"{where}: opset {version}; expected >= {MIN_OPSET}")
    got_in = [i.name for i in model.graph.input]
    got_out = [o.name for o in model.graph.output]
    if got_in != list(stage.inputs) or got_out != list(stage.outputs):
        raise ExportError(
            f"{where}: graph reads {got_in} and returns {got_out}; expected {list(stage.inputs)} "
            f"-> {list(stage.outputs)}"
        )
    for vi in list(model.graph.input) + list(model.graph.output):
        _check_dims(where, vi)


_DIMS_EXPECTED = "expected the batch on axis 0 of every input, output and carry and every other dimension fixed"


def _check_dims(where: str, vi: onnx.ValueInfoProto) -> None:
    """A dynamic batch on axis 0 and fixed sizes elsewhere; else one line naming the tensor, its shape in the
    graph, the likely cause and the usual fix."""
    dims = vi.type.tensor_type.shape.dim
    shape = "(" + ", ".join(d.dim_param or (str(d.dim_value) if d.dim_value else "?") for d in dims) + ")"
    what = f"{where}: tensor {vi.name!r} has shape {shape} in the exported graph"
    moved = [i for i, d in enumerate(dims) if i and d.dim_param == BATCH]
    if moved or (dims and dims[0].dim_value and any(d.dim_param and not d.dim_value for d in dims[1:])):
        axis = f"axis {moved[0]}" if moved else "another axis"
        raise ExportError(
            f"{what}: the batch is on {axis}; {_DIMS_EXPECTED}: return it batch-first (batch_first=True for "
            "an RNN or attention layer, or .transpose back to put the batch first before the body returns; the "
            "next body transposes again)"
        )
    if not dims or not dims[0].dim_param or dims[0].dim_value:
        raise ExportError(
            f"{what}: no dynamic batch dimension; {_DIMS_EXPECTED}: keep axis 0 the batch (no reduction over it, "
            "no reshape that folds it into another axis)"
        )
    rest = [i for i, d in enumerate(dims) if i and not d.dim_value]
    if rest:
        raise ExportError(
            f"{what}: dimension {rest[0]} is not fixed; {_DIMS_EXPECTED}: a size the exporter cannot prove "
            "constant comes from an operator such as torch.sort, topk or nonzero, or from a size computed from "
            "the data; rewrite it with fixed sizes, or try --exporter dynamo (its shape analysis proves more)"
        )


def tensor_infos(values) -> tuple[TensorInfo, ...]:
    """Manifest entries (name, shape with None for the batch, numpy dtype) of graph inputs or outputs."""
    out = []
    for vi in values:
        tt = vi.type.tensor_type
        shape = tuple(None if (d.dim_param or not d.dim_value) else int(d.dim_value) for d in tt.shape.dim)
        out.append(TensorInfo(vi.name, shape, _ONNX_TO_NUMPY.get(tt.elem_type, str(tt.elem_type))))
    return tuple(out)


def graph_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def thread_count() -> int:
    """onnxruntime threads for verification and profiling: the machine's cores, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))
