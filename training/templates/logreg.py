"""Logistic regression: a linear model over dense inputs and hashed categorical weights."""

from __future__ import annotations

import torch
from torch import nn

from training.bundle import BundleSpec, register_template

# No params of its own: the shared ones (``training.params.COMMON``) are all it reads.
PARAMS: dict = {}


class LogisticRegression(nn.Module):
    def __init__(self, dense_dim: int, buckets: list[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(dense_dim, 1) if dense_dim else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.cat_weights = nn.ModuleList(nn.Embedding(b + 1, 1) for b in buckets)
        for emb in self.cat_weights:
            nn.init.zeros_(emb.weight)

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        out = self.bias.expand(dense.shape[0]).clone()
        if self.linear is not None:
            out = out + self.linear(dense).squeeze(-1)
        for i, emb in enumerate(self.cat_weights):
            out = out + emb(cat[:, i]).squeeze(-1)
        return out


@register_template("logreg", params=PARAMS)
def build(spec: BundleSpec) -> nn.Module:
    return LogisticRegression(spec.dense_dim, [f.buckets for f in spec.categorical_features])
