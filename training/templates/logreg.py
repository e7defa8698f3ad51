"""Logistic regression: a linear model over dense inputs and one weight per categorical index
(a list field: the mean of its items' weights; see ``training.templates.inputs``)."""

from __future__ import annotations

import torch
from torch import nn

from training.bundle import BundleSpec, register_template
from training.templates.inputs import field_weights

# No params of its own: the shared ones (``training.params.COMMON``) are all it reads.
PARAMS: dict = {}


class LogisticRegression(nn.Module):
    def __init__(self, spec: BundleSpec) -> None:
        super().__init__()
        dense_dim = spec.dense_dim
        self.linear = nn.Linear(dense_dim, 1) if dense_dim else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.cat_weights = field_weights(spec)

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        out = self.bias.expand(dense.shape[0]).clone()
        if self.linear is not None:
            out = out + self.linear(dense).squeeze(-1)
        return self.cat_weights.first_order(cat, out)


@register_template("logreg", params=PARAMS)
def build(spec: BundleSpec) -> nn.Module:
    return LogisticRegression(spec)
