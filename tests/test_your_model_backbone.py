"""Exits on an existing backbone: torchvision ResNet, MobileNetV3 and ViT (and timm) cut into stages after named
modules, exported per stage and verified against torch; starting weights from the backbone's own state dict.

Skipped where torchvision is not installed (the 'vision' extra). Nothing is downloaded: random weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from cis.core.errors import CisError  # noqa: E402
from cis.training.models.vision import import_torchvision  # noqa: E402

try:
    tv = import_torchvision()
except ModuleNotFoundError:
    pytest.skip("torchvision not installed (pip install 'cis-inference[vision]')", allow_module_level=True)

from cis.training.models.backbone import split_after, torchvision_model, with_exits  # noqa: E402
from cis.training.models.contract import EarlyExitNet, ExitHead, TokenHead  # noqa: E402

SHAPE = (3, 32, 32)
BACKBONES = {  # name: (factory source, after)
    "resnet18": ('torchvision_model("resnet18", num_classes=num_classes)', ["layer1", "layer2", "layer4"]),
    "mobilenet_v3_small": ('torchvision_model("mobilenet_v3_small", num_classes=num_classes)',
                           ["features.3", "features.8", "features.12"]),
    "vit": ("VisionTransformer(32, 8, 4, 2, 32, 64, num_classes=num_classes)",
            ["encoder.layers.encoder_layer_1", "encoder.layers.encoder_layer_2", "encoder.layers.encoder_layer_3"]),
}


def model_file(tmp_path, name: str) -> str:
    """A user's model file (outside the repo) that cuts a torchvision backbone with the helper."""
    source, after = BACKBONES[name]
    tokens = "cls" if name == "vit" else "mean"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f"""
        from torchvision.models.vision_transformer import VisionTransformer
        from cis.training.models.backbone import torchvision_model, with_exits


        def make(num_classes, input_shape):
            net = {source}
            return with_exits(net, after={after!r}, num_classes=num_classes, input_shape=input_shape,
                              tokens={tokens!r})
        """))
    return f"{path}:make"


def test_resnet_stages_reproduce_the_backbone_and_get_pooled_heads():
    net = torchvision_model("resnet18", num_classes=10).eval()
    pairs = with_exits(net, ["layer1", "layer2", "layer4"], 10, SHAPE)
    assert all(isinstance(head, ExitHead) for _, head in pairs)
    x = torch.randn(2, *SHAPE)
    with torch.no_grad():
        f = x
        for body, _ in pairs:
            f = body.eval()(f)
        want = net.layer4(net.layer3(net.layer2(net.layer1(net.maxpool(net.relu(net.bn1(net.conv1(x))))))))
    torch.testing.assert_close(f, want)
    assert [head.fc.in_features for _, head in pairs] == [64, 128, 512]


def test_vit_stages_carry_tokens_and_read_the_cls_token():
    from torchvision.models.vision_transformer import VisionTransformer

    pairs = with_exits(VisionTransformer(32, 8, 4, 2, 32, 64, num_classes=10),
                       ["encoder.layers.encoder_layer_1", "encoder.layers.encoder_layer_3"], 10, SHAPE, tokens="cls")
    model = EarlyExitNet(pairs, input_shape=SHAPE)
    assert all(isinstance(head, TokenHead) and head.pool == "cls" for _, head in pairs)
    assert [tuple(t.shape) for t in model(torch.randn(3, *SHAPE))] == [(3, 10), (3, 10)]


def test_a_cut_that_is_not_a_narrow_point_or_unknown_is_one_line():
    net = torchvision_model("resnet18")
    with pytest.raises(CisError, match="cut after module layer1.0.conv1 is not a narrow point: stage 2 also needs"):
        split_after(net, ["layer1.0.conv1", "layer2"])
    with pytest.raises(CisError, match="first unknown: layer9; its top-level modules: conv1, bn1"):
        split_after(net, ["layer1", "layer9"])
    with pytest.raises(CisError, match="in the order the backbone runs them"):
        split_after(net, ["layer2", "layer1"])
    with pytest.raises(CisError, match="weights are not downloaded"):
        torchvision_model("resnet18", weights="DEFAULT")


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_a_backbone_model_file_exports_per_stage_verified_against_torch(tmp_path, name, one_torch_thread):
    from cis.core.spec import spec_to_dict
    from cis.core.topologies import make_spec
    from cis.exporter.bundle_writer import export_bundle
    from cis.training.checkpoint import save_checkpoint
    from cis.training.data.loading import Dataset
    from cis.training.models.model_ref import user_model

    ref = model_file(tmp_path, name)
    model = user_model(ref, {}, {"num_classes": 10, "input_shape": SHAPE}, torch.float32)
    rng = np.random.default_rng(0)
    val = Dataset(rng.standard_normal((40, *SHAPE)).astype(np.float32), rng.integers(0, 10, 40),
                  [str(c) for c in range(10)], [0.5] * 3, [0.25] * 3, "images")
    meta = {"classes": val.classes, "normalisation": {"mean": val.mean, "std": val.std}, "dataset": "images",
            "spec": spec_to_dict(make_spec("paper-7", "60-30-10", num_classes=10))}
    save_checkpoint(tmp_path / "run", model, meta)
    report = export_bundle(tmp_path / "run", tmp_path / "bundle", val=val, latency_repeats=1, latency_batches=(1,))
    assert report["verification"]["passed"] and report["stages"] == 3
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == [None, *SHAPE] and manifest["inputs"][0]["dtype"] == "float32"
    assert manifest["inputs"][0]["preprocessing"] == {"kind": "normalise", "scale": 1 / 255, "mean": [0.5] * 3,
                                                      "std": [0.25] * 3}
    assert manifest["model"]["reference"] == ref


def test_backbone_weights_load_into_the_stages_by_their_own_names(tmp_path):
    from cis.training.weights_file import load_weights

    donor = torchvision_model("resnet18", num_classes=10)
    torch.save(donor.state_dict(), tmp_path / "resnet18.pt")
    model = EarlyExitNet(with_exits(torchvision_model("resnet18", num_classes=10), ["layer1", "layer2", "layer4"],
                                    10, SHAPE))
    lines: list[str] = []
    report = load_weights(model, tmp_path / "resnet18.pt", lines.append)
    assert report["unexpected"] == ["fc.weight", "fc.bias"]
    assert all(".head." in k for k in report["missing"]) and len(report["missing"]) == 6
    torch.testing.assert_close(model.state_dict()["stage_list.2.body.layer4.1.conv2.weight"],
                               donor.state_dict()["layer4.1.conv2.weight"])
    assert len(lines) == 3 and lines[2].startswith(f"--weights {tmp_path / 'resnet18.pt'}: unexpected 2")


def test_a_model_file_that_imports_torchvision_loads_in_a_fresh_process(tmp_path):
    ref = model_file(tmp_path, "mobilenet_v3_small")
    code = (
        "import torch; from cis.training.models.model_ref import user_model; "
        f"m = user_model({ref!r}, {{}}, {{'num_classes': 10, 'input_shape': (3, 32, 32)}}, torch.float32); "
        "print(m.num_exits)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr[-2000:]
    assert done.stderr.count("CUDA build") <= 1  # the fallback (where it is needed) says so once


def test_timm_backbones_cut_too():
    pytest.importorskip("timm")
    from cis.training.models.backbone import timm_model

    vit = timm_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=10, depth=4)
    model = EarlyExitNet(with_exits(vit, ["blocks.1", "blocks.3"], 10, SHAPE, tokens="cls"), input_shape=SHAPE)
    resnet = timm_model("resnet18", num_classes=10)
    model2 = EarlyExitNet(with_exits(resnet, ["layer1", "layer3", "layer4"], 10, SHAPE), input_shape=SHAPE)
    x = torch.randn(2, *SHAPE)
    assert [tuple(t.shape) for t in model(x)] == [(2, 10)] * 2 and [tuple(t.shape) for t in model2(x)] == [(2, 10)] * 3
