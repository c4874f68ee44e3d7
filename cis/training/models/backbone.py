"""Exits on an existing backbone: cut a torchvision or timm model into stages after named modules.

    net = torchvision_model("resnet18", num_classes=10)        # random weights: nothing is downloaded
    stages = with_exits(net, after=["layer1", "layer2", "layer4"], num_classes=10, input_shape=(3, 32, 32))
    # -> [(body1, head1), (body2, head2), (body3, head3)], the public contract (cis/training/models/contract.py)

:func:`with_exits` traces the backbone with ``torch.fx`` (as torchvision's ``feature_extraction`` does), the
modules named in ``after`` kept whole, and cuts the graph after each of them: body k computes everything
from the previous cut to module ``after[k]``'s output, which is the next stage's carry; what follows the
last named module (the backbone's own pooling and classifier) is dropped. Each stage gets a default head
by its carry's rank (:func:`cis.training.models.contract.default_head`: 4-D pool + linear, 3-D tokens LayerNorm + linear
on their mean or ``tokens="cls"`` the first token, 2-D linear), or the ``heads`` given.

A cut must be a narrow point of the network: only module ``after[k]``'s output may cross it. Where more
crosses (a skip connection around the named module, a value of the input reused later), one line names the
cut and what else crosses; cut after a whole block instead (``layer2``, not ``layer2.0.conv1``). Values that
depend on parameters alone (a class token, position embeddings) are recomputed in the stage that uses them.
The graph is traced in eval mode: Python branches on ``self.training`` inside traced (non-leaf) modules keep
their eval branch (torch.nn layers such as Dropout and BatchNorm still follow train()/eval()).

Known to cut: torchvision ResNet (``layer1`` .. ``layer4``), MobileNetV3 (``features.K``), ViT
(``encoder.layers.encoder_layer_K``); timm ResNet (``layer1`` .. ``layer4``) and ViT (``blocks.K``). Starting
weights come from a local file (``cis train --weights FILE``: the backbone's own state-dict names load into the
stages).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from cis.core.errors import CisError, error_line
from cis.training.models.contract import default_head
from cis.training.models.vision import import_timm, import_torchvision


class _Tracer(fx.Tracer):
    """Keeps the named modules whole (one call_module node each)."""

    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        return qualified_name in self.leaves or super().is_leaf_module(m, qualified_name)


def _free_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes that do not depend on the input (parameters, buffers, constants): recomputed where used."""
    tied: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or any(a in tied for a in node.all_input_nodes):
            tied.add(node)
    return {n for n in graph.nodes if n not in tied and n.op != "output"}


def _assign(graph: fx.Graph, cuts: list[fx.Node], free: set[fx.Node]) -> dict[fx.Node, int]:
    """Stage index (0-based) of every input-dependent node that some cut needs: the first cut it leads to."""
    stage: dict[fx.Node, int] = {}
    for k, cut in enumerate(cuts):
        todo = [cut]
        while todo:
            node = todo.pop()
            if node in stage or node in free or node.op == "placeholder":
                continue
            stage[node] = k
            todo.extend(node.all_input_nodes)
    return stage


def _stage_module(root: nn.Module, graph: fx.Graph, k: int, cuts: list[fx.Node], stage: dict[fx.Node, int],
                  free: set[fx.Node], names: Sequence[str]) -> fx.GraphModule:
    carry = next(n for n in graph.nodes if n.op == "placeholder") if k == 0 else cuts[k - 1]
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {carry: g.placeholder("carry")}

    def value(node: fx.Node) -> fx.Node:
        if node in env:
            return env[node]
        if node in free:
            env[node] = g.node_copy(node, value)
            return env[node]
        where = "the input" if node.op == "placeholder" else f"{node.name} ({node.op} {node.target})"
        if k == 0:  # stage 1 reads the input itself: it cannot need anything before it
            raise CisError(f"with_exits: stage 1 needs {where}, which nothing before it computes")
        raise CisError(
            f"with_exits: the cut after module {names[k - 1]} is not a narrow point: stage {k + 1} also needs {where} "
            "from before it; expected only that module's output to cross (cut after a whole block)"
        )

    for node in graph.nodes:
        if stage.get(node) == k and node not in env:
            env[node] = g.node_copy(node, value)
    g.output(env[cuts[k]])
    return fx.GraphModule(root, g, class_name=f"Stage{k + 1}Body")


def _defaults(backbone: nn.Module) -> dict[str, Any]:
    """forward's optional arguments after the input, fixed at their defaults (e.g. timm's ``attn_mask=None``)."""
    params = list(inspect.signature(backbone.forward).parameters.values())[1:]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def split_after(backbone: nn.Module, after: Sequence[str]) -> list[fx.GraphModule]:
    """The backbone's bodies: body k runs from the previous cut to module ``after[k]``'s output."""
    after = list(after)
    modules = dict(backbone.named_modules())
    unknown = [a for a in after if a not in modules or not a]
    twice = [a for k, a in enumerate(after) if a in after[:k]]
    if unknown or twice or not after:
        top = ", ".join(n for n, _ in backbone.named_children())
        what = (
            "no names" if not after else f"first unknown: {unknown[0] or repr('')}" if unknown
            else f"{twice[0]} named twice"
        )
        raise CisError(
            f"with_exits: after={after!r}; expected distinct names of the backbone's modules "
            f"({what}; its top-level modules: {top})"
        )
    was_training = backbone.training
    backbone.eval()
    try:
        graph = _Tracer(set(after)).trace(backbone, concrete_args=_defaults(backbone))
    except Exception as exc:
        raise CisError(f"with_exits: torch.fx cannot trace {type(backbone).__name__} ({error_line(exc)})") from None
    finally:
        backbone.train(was_training)
    calls = {n.target: n for n in graph.nodes if n.op == "call_module" and n.target in set(after)}
    cuts = [calls[a] for a in after]
    order = {n: i for i, n in enumerate(graph.nodes)}
    if any(order[b] <= order[a] for a, b in zip(cuts, cuts[1:])):
        raise CisError(f"with_exits: after={after!r}; expected the modules in the order the backbone runs them")
    free = _free_nodes(graph)
    stage = _assign(graph, cuts, free)
    bodies = [_stage_module(backbone, graph, k, cuts, stage, free, after) for k in range(len(cuts))]
    for body in bodies:
        body.train(was_training)
    return bodies


def with_exits(
    backbone: nn.Module,
    after: Sequence[str],
    num_classes: int,
    input_shape: Sequence[int],
    input_dtype: torch.dtype = torch.float32,
    tokens: str = "mean",
    heads: Sequence[nn.Module] | None = None,
) -> list[tuple[nn.Module, nn.Module]]:
    """``(body, head)`` pairs cutting ``backbone`` after each module named in ``after`` (module docstring).

    ``input_shape``: one sample's shape (the heads are sized on a batch of two zeros of ``input_dtype``);
    ``tokens``: how a 3-D carry's default head pools (``mean``, ``cls``, or ``channels`` for (N, C, L));
    ``heads``: one module per exit instead of the defaults."""
    bodies = split_after(backbone, after)
    if heads is not None and len(heads) != len(bodies):
        raise CisError(f"with_exits: {len(heads)} heads for {len(bodies)} exits; expected one head per exit")
    x = torch.zeros((2, *input_shape), dtype=input_dtype)
    pairs: list[tuple[nn.Module, nn.Module]] = []
    was_training = backbone.training
    with torch.no_grad():
        for k, body in enumerate(bodies):
            body.eval()
            try:
                x = body(x)
            except Exception as exc:
                raise CisError(
                    f"with_exits: body {k + 1} (up to {after[k]!r}) fails on inputs of shape {(2, *input_shape)} "
                    f"({error_line(exc)})"
                ) from None
            body.train(was_training)
            head = heads[k] if heads is not None else default_head(x, num_classes, tokens)
            pairs.append((body, head))
    return pairs


def torchvision_model(name: str, **kwargs: Any) -> nn.Module:
    """A torchvision classification model by name (``torchvision.models.get_model``) with random weights;
    nothing is downloaded (start from a local file with ``--weights FILE``)."""
    if kwargs.get("weights") is not None:
        raise CisError(
            f"torchvision_model({name!r}): weights are not downloaded; pass a local file with --weights FILE"
        )
    models = import_torchvision().models
    try:
        return models.get_model(name, **{**kwargs, "weights": None})
    except ValueError as exc:
        raise CisError(f"torchvision_model({name!r}): {exc}") from None


def timm_model(name: str, **kwargs: Any) -> nn.Module:
    """A timm model by name (``timm.create_model``) with random weights; nothing is downloaded."""
    if kwargs.pop("pretrained", False):
        raise CisError(f"timm_model({name!r}): weights are not downloaded; pass a local file with --weights FILE")
    timm = import_timm()
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except RuntimeError as exc:  # timm's unknown model
        raise CisError(f"timm_model({name!r}): {exc}") from None
