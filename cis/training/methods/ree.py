"""ReeFL's recurrent early-exit module (Ree) and its shared classifier.

After backbone block l the CLS history is q = [z_meta, cls_1, .., cls_l]; Ree maps
q + p[:l+1] (p: learnable positions, L+1 of them) to m^l = [m_0^l, .., m_l^l]:

- exit l predicts ``Classifier(m_0^l + cls_l)`` (LayerNorm + Linear, one for all exits);
- with modulation on, block l+1 reads m_l^l in place of cls_l (Eq. 4); off, the
  backbone keeps its own CLS token (the paper's ablation).

Sizes follow the authors' code (binding notes): one pre-norm transformer block,
8 heads whose q/k/v together are 16 wide (2 per head: the "bottleneck features
for MSA"), an MLP 1.35x the token width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

REE_HEADS = 8
REE_ATTN_DIM = 16
REE_MLP_RATIO = 1.35


def broadcast_param(param: Tensor, like: Tensor) -> Tensor:
    """``param`` (1, ..) repeated over the batch of ``like`` (same shape as ``like``).

    ``like`` clamped to [0, 0] is an exact zero of ``like``'s shape, even where
    ``like`` holds +-inf (``like * 0`` would give NaN there); detached, so no
    gradient flows into ``like``. Unlike ``expand(N, ...)`` / ``zeros_like`` it
    exports to a Clip whose output keeps ``like``'s static shape in ONNX.
    """
    return like.detach().clamp(0.0, 0.0) + param


def multihead_attention(
    x: Tensor, w: Tensor, b: Tensor, w_out: Tensor, b_out: Tensor, heads: int, head_dim: int
) -> Tensor:
    """Self-attention of ``x`` (N, T, D) with a fused qkv projection ``w`` (3 * heads * head_dim, D),
    layout [q|k|v] x heads x head_dim.

    Written with einsum over reshaped *weights* so that no activation is reshaped
    by a traced size: the exported ONNX graph keeps every dimension but the batch
    static (``unflatten`` / ``view(n, t, ...)`` of activations leave the token
    dimension symbolic after ONNX shape inference).
    """
    qkv = torch.einsum("ntd,khed->knhte", x, w.reshape(3, heads, head_dim, -1)) + b.reshape(3, 1, heads, 1, head_dim)
    q, k, v = qkv[0], qkv[1], qkv[2]  # (N, heads, T, head_dim)
    out = torch.softmax(q @ k.transpose(-2, -1) * head_dim**-0.5, dim=-1) @ v
    return torch.einsum("nhte,dhe->ntd", out, w_out.reshape(-1, heads, head_dim)) + b_out



class BottleneckAttention(nn.Module):
    """Multi-head self-attention whose q/k/v live in ``attn_dim`` < ``dim`` channels."""

    def __init__(self, dim: int, heads: int = REE_HEADS, attn_dim: int = REE_ATTN_DIM) -> None:
        super().__init__()
        if attn_dim % heads:
            raise ValueError(f"Ree attention: attn_dim {attn_dim} is not divisible by {heads} heads")
        self.heads, self.scale = heads, (attn_dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * attn_dim)
        self.proj = nn.Linear(attn_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        hd = self.qkv.out_features // (3 * self.heads)
        return multihead_attention(x, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias, self.heads, hd)


class Ree(nn.Module):
    """One pre-norm transformer block over [z_meta, cls_1..cls_l] with learnable positions."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.meta = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, depth + 1, dim))
        nn.init.trunc_normal_(self.meta, std=0.02)
        nn.init.trunc_normal_(self.pos, std=0.02)
        hidden = round(REE_MLP_RATIO * dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = BottleneckAttention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, history: Tensor) -> Tensor:
        """``history`` (N, l, D) = [cls_1..cls_l]; returns m^l (N, l+1, D) = [m_0 .. m_l]."""
        meta = broadcast_param(self.meta, history[:, :1])
        q = torch.cat([meta, history], dim=1)
        q = q + self.pos[:, : q.shape[1]]
        q = q + self.attn(self.norm1(q))
        return q + self.mlp(self.norm2(q))


class NormLinear(nn.Module):
    """LayerNorm + Linear: the classifier of every exit (shared in ReeFL, one per exit elsewhere)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.norm(x))


def ree_step(ree: Ree, tokens: Tensor, history: Tensor | None, modulation: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Ree after one backbone block.

    ``tokens`` (N, 1+n, D) is the block's output (CLS first), ``history`` (N, l-1, D)
    the earlier CLS tokens (None after the first block). Returns (tokens for the next block, history (N, l, D),
    feature m_0^l + cls_l for the shared classifier).
    """
    cls = tokens[:, :1]
    history = cls if history is None else torch.cat([history, cls], dim=1)
    m = ree(history)
    feature = m[:, 0] + cls[:, 0]
    if modulation:
        tokens = torch.cat([m[:, -1:], tokens[:, 1:]], dim=1)
    return tokens, history, feature
