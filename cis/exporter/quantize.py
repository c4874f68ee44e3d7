"""Carries in fp16 or int8: a cast or a quantiser baked into the stage boundary.

A node forwards its carry in the bundle's feature dtype. The conversion lives
inside the graphs, so the runtime only moves tensors whose dtype the manifest
states:

- ``fp32``: the graphs as exported;
- ``fp16``: the sender ends with ``Cast(float16)``, the receiver starts with ``Cast(float32)``;
- ``int8``: the sender ends with ``QuantizeLinear(scale, zero_point)``, the receiver
  starts with ``DequantizeLinear`` with the same per-tensor parameters, which
  :func:`calibrate_int8` sets from the range the carry takes on validation data
  (asymmetric, so a ReLU feature map uses all 256 levels). They are stored in the
  manifest beside each carry tensor (``scale``, ``zero_point``).

Only float32 carries are converted: a carry of another dtype (a bool mask, int64 ids, a float64 tensor)
and a passthrough input that is not float32 cross the boundary as they are in every variant (the manifest
states each tensor's dtype, so the runtime forwards them as they are).

The graphs are rewritten, not re-exported: every tensor of the exported graph
gets a prefix, and conversion (or Identity) nodes join the new boundary names
to the old ones, so any graph shape (features, token state, passthrough input)
works the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cis.core.errors import CisError

FEATURE_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
_PREFIX = "stage/"
_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8}


def check_feature_dtype(name: str) -> str:
    if name not in FEATURE_DTYPES:
        raise CisError(f"feature dtype {name!r}: unknown; expected one of {', '.join(FEATURE_DTYPES)}")
    return name


def calibrate_int8(samples: Mapping[str, list[np.ndarray]]) -> dict[str, tuple[float, int]]:
    """Per-tensor (scale, zero_point) covering each carry's observed range (and 0)."""
    qparams = {}
    for name, parts in samples.items():
        lo = min(0.0, min(float(np.min(p)) for p in parts))
        hi = max(0.0, max(float(np.max(p)) for p in parts))
        scale = (hi - lo) / 255.0
        if not np.isfinite(scale) or scale <= 0:
            scale = 1.0
        zero_point = int(np.clip(np.round(-128 - lo / scale), -128, 127))
        qparams[name] = (float(np.float32(scale)), zero_point)
    return qparams


def quantize_np(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """What ONNX QuantizeLinear computes (round half to even, saturate)."""
    return np.clip(np.rint(x / np.float32(scale)) + zero_point, -128, 127).astype(np.int8)


def dequantize_np(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return ((q.astype(np.int32) - zero_point) * np.float32(scale)).astype(np.float32)


def apply_feature_dtype(
    model: onnx.ModelProto,
    carry_in: tuple[str, ...],
    carry_out: tuple[str, ...],
    feature_dtype: str,
    qparams: Mapping[str, tuple[float, int]] | None = None,
) -> onnx.ModelProto:
    """The stage graph with its carry inputs and outputs in ``feature_dtype``."""
    check_feature_dtype(feature_dtype)
    if feature_dtype == "fp32":
        return model
    carry_in = convertible(model.graph.input, carry_in)
    carry_out = convertible(model.graph.output, carry_out)
    if not (carry_in or carry_out):
        return model
    if feature_dtype == "int8":
        missing = [n for n in (*carry_in, *carry_out) if n not in (qparams or {})]
        if missing:
            raise CisError(f"int8 carry {missing[0]!r}: no calibrated scale")
    inner = onnx.compose.add_prefix(model, _PREFIX)
    g = inner.graph
    convert = _CarryConversion(feature_dtype, qparams or {})
    new_inputs, pre = convert.boundary(model.graph.input, carry_in, inward=True)
    new_outputs, post = convert.boundary(model.graph.output, carry_out, inward=False)
    graph = helper.make_graph(
        pre + list(g.node) + post,
        model.graph.name or "stage",
        new_inputs,
        new_outputs,
        initializer=list(g.initializer) + convert.consts,
        value_info=list(g.value_info),
    )
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out


def convertible(values, carries: tuple[str, ...]) -> tuple[str, ...]:
    """The carries among a graph's inputs or outputs (``values``) that a variant converts: the float32 ones."""
    return tuple(
        vi.name for vi in values if vi.name in carries and vi.type.tensor_type.elem_type == TensorProto.FLOAT
    )


class _CarryConversion:
    """The nodes that convert a stage's carries between ``feature_dtype`` and its float32 inner graph, and the
    constants they need (int8's scales and zero points)."""

    def __init__(self, feature_dtype: str, qparams: Mapping[str, tuple[float, int]]) -> None:
        self.feature_dtype, self.qparams = feature_dtype, qparams
        self.elem = _ELEM[FEATURE_DTYPES[feature_dtype]]
        self.consts: list[onnx.TensorProto] = []

    def qnames(self, name: str) -> tuple[str, str]:
        scale, zp = self.qparams[name]
        s_name, z_name = f"{name}/scale", f"{name}/zero_point"
        if s_name not in {c.name for c in self.consts}:
            self.consts.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), s_name))
            self.consts.append(numpy_helper.from_array(np.array(zp, dtype=np.int8), z_name))
        return s_name, z_name

    def boundary(self, values, carries: tuple[str, ...], inward: bool) -> tuple[list, list]:
        """The graph's inputs (``inward``) or outputs, retyped where they carry, and the nodes that
        convert between them and the float32 inner graph (Identity where nothing changes)."""
        kept, nodes = [], []
        for vi in values:
            name = vi.name
            src, dst = (name, _PREFIX + name) if inward else (_PREFIX + name, name)
            if name not in carries:
                kept.append(vi)
                nodes.append(helper.make_node("Identity", [src], [dst], name=f"{name}/{'in' if inward else 'out'}"))
                continue
            kept.append(_retyped(vi, self.elem))
            if self.feature_dtype == "fp16":
                to, what = (TensorProto.FLOAT, "to_float") if inward else (TensorProto.FLOAT16, "to_half")
                nodes.append(helper.make_node("Cast", [src], [dst], to=to, name=f"{name}/{what}"))
            else:
                op, what = ("DequantizeLinear", "dequantize") if inward else ("QuantizeLinear", "quantize")
                nodes.append(helper.make_node(op, [src, *self.qnames(name)], [dst], name=f"{name}/{what}"))
        return kept, nodes


def _retyped(vi: onnx.ValueInfoProto, elem: int) -> onnx.ValueInfoProto:
    new = onnx.ValueInfoProto()
    new.CopyFrom(vi)
    new.type.tensor_type.elem_type = elem
    return new
