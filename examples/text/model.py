"""The text example's model: a small transformer classifier with an exit after each encoder layer.

Plain PyTorch, nothing from cis. ``cis train --model examples/text/model.py:make`` calls ``make``; cis fills
``num_classes`` and ``input_shape`` (one sample's shape: ``(L,)`` token ids) from the data; ``vocab``,
``dim`` and ``heads`` are ``--model-arg`` values (``vocab`` must exceed the data's largest id).

    stage 1: embed the ids (token + position) -> encoder layer 1 -> (N, L, dim)  -> exit 1
    stage 2: encoder layer 2                                      -> (N, L, dim)  -> exit 2
    stage 3: encoder layer 3                                      -> (N, L, dim)  -> exit 3

Each head averages the tokens, normalises and maps to the classes. The carry between stages is the token
sequence ``(N, L, dim)`` float32; stage 1 takes int64 ids ``(N, L)``.
"""

from __future__ import annotations

import torch
from torch import nn


class Embed(nn.Module):
    """Token ids (N, L) -> token plus learned position embeddings (N, L, dim)."""

    def __init__(self, vocab: int, length: int, dim: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(1, length, dim))
        nn.init.normal_(self.position, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.token(ids) + self.position


class MeanHead(nn.Module):
    """Tokens (N, L, dim) -> logits (N, num_classes): mean over the tokens, LayerNorm, linear."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(tokens.mean(dim=1)))


def encoder_layer(dim: int, heads: int) -> nn.Module:
    return nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)


def make(num_classes: int, input_shape: tuple[int, ...], vocab: int = 64, dim: int = 32,
         heads: int = 2) -> list[tuple[nn.Module, nn.Module]]:
    """Three ``(body, head)`` stages: the public contract (docs/your-model.md)."""
    (length,) = input_shape
    first = nn.Sequential(Embed(vocab, length, dim), encoder_layer(dim, heads))
    return [(first, MeanHead(dim, num_classes)),
            (encoder_layer(dim, heads), MeanHead(dim, num_classes)),
            (encoder_layer(dim, heads), MeanHead(dim, num_classes))]
