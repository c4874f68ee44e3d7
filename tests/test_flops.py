"""FLOPs of a transformer's stages are its real work (issue 43 item 5): in eval mode torch's fused fast path of
``nn.TransformerEncoderLayer`` hid it (192 FLOPs per stage, the heads' alone), which skewed ``cis inspect``,
``--strategy flops/auto`` and ``--lower-exit-steps flops``. The count is checked against the layer's analytic
count: projections, attention scores and weighted values, feed-forward (2 FLOPs per multiply-add)."""

from __future__ import annotations

from functools import partial

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from cis.training.models.contract import EarlyExitNet  # noqa: E402
from cis.training.models.flops import count_flops, exit_costs  # noqa: E402

L, D, FF, C = 16, 32, 64, 4


def encoder_layer_flops(length: int, dim: int, ff: int) -> int:
    projections = 4 * 2 * length * dim * dim  # q, k, v and the output projection
    attention = 2 * (2 * length * length * dim)  # q k^T and the weighted sum of v, over all heads
    feed_forward = 2 * 2 * length * dim * ff
    return projections + attention + feed_forward


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, C)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(h.mean(dim=1))


def layer(batch_first: bool = True) -> nn.Module:
    return nn.TransformerEncoderLayer(D, 2, FF, dropout=0.0, batch_first=batch_first)


def model(body: nn.Module) -> EarlyExitNet:
    m = EarlyExitNet([(nn.Embedding(50, D), Head()), (body, Head()), (layer(), Head())])
    m.set_input((L,), torch.int64)
    return m


@pytest.mark.parametrize("body", ["layer", "encoder"])
def test_an_encoder_stage_counts_its_attention_and_feed_forward(body):
    second = layer() if body == "layer" else nn.TransformerEncoder(layer(), num_layers=2, enable_nested_tensor=False)
    layers = 1 if body == "layer" else 2
    costs = exit_costs(model(second).eval())
    head = 2 * D * C
    per_layer = encoder_layer_flops(L, D, FF)
    assert costs[0]["flops"] == head  # an embedding is a lookup
    assert costs[1]["flops"] - costs[0]["flops"] == layers * per_layer + head
    assert costs[2]["flops"] - costs[1]["flops"] == per_layer + head


def test_the_count_leaves_the_fast_path_as_it_was_and_counts_cpu_attention():
    assert torch.backends.mha.get_fastpath_enabled()
    q = torch.zeros(1, 2, L, D // 2)
    flops = count_flops(lambda: nn.functional.scaled_dot_product_attention(q, q, q))
    assert flops == 2 * (2 * L * L * D)
    assert torch.backends.mha.get_fastpath_enabled()


def resnet_vit_and_encoder():
    from cis.training.methods.vit import ViTEE
    from cis.training.models.cnns import DigitsCNN, ResNet18EE

    return [ResNet18EE(width=0.25), DigitsCNN(), ViTEE(), model(layer())]


@pytest.mark.parametrize("which", range(4), ids=["resnet18", "digits-cnn", "vit", "encoder"])
def test_the_count_equals_torch_s_flop_counter_mode(which):
    """count_flops runs its own dispatch mode (no dynamo import); its totals are FlopCounterMode's, op by op."""
    from torch.utils.flop_counter import FlopCounterMode

    from cis.training.models.flops import _UNCOUNTED

    net = resnet_vit_and_encoder()[which].eval()
    x = torch.zeros((1, *net.input_shape), dtype=getattr(net, "input_dtype", torch.float32))
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        for e in range(1, net.num_exits + 1):
            with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_UNCOUNTED) as reference:
                net(x, upto=e)
            assert count_flops(partial(net, x, upto=e)) == reference.get_total_flops() > 0
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def test_counting_does_not_import_dynamo():
    import subprocess
    import sys

    code = (
        "import sys; from cis.training.models.cnns import DigitsCNN; from cis.training.models.flops import exit_costs;"
        " exit_costs(DigitsCNN()); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
