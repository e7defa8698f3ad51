"""Fine ranking: a DCN-v2 style CTR model.

Categorical features get embeddings (a list of categories: the mean of its items'; see
``training.templates.inputs``); dense inputs (numbers, embedding features) are concatenated
with them into ``x0``. A stack of full-rank cross layers (``x_{l+1} = x0 * (W x_l + b) + x_l``)
learns explicit feature interactions (e.g. user interest x ad category), a small MLP learns the
implicit ones, and a linear head combines both into one logit.
"""

from __future__ import annotations

import torch
from torch import nn

from training.bundle import BundleSpec
from training.templates.inputs import FieldEmbedding
from training.templates.schemas import FINE_RANKING_PARAMS, with_defaults


class CrossLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.linear(x) + x


class DCNv2(nn.Module):
    def __init__(
        self,
        spec: BundleSpec,
        *,
        embedding_dim: int,
        cross_layers: int,
        hidden: list[int],
        dropout: float,
    ) -> None:
        super().__init__()
        self.embeddings = FieldEmbedding(spec, embedding_dim)
        for emb in self.embeddings:
            nn.init.normal_(emb.weight, std=0.05)
        width = spec.dense_dim + embedding_dim * len(self.embeddings)
        self.width = max(width, 1)
        self.cross = nn.ModuleList(CrossLayer(self.width) for _ in range(cross_layers))
        layers: list[nn.Module] = []
        previous = self.width
        for size in hidden:
            layers += [nn.Linear(previous, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            previous = size
        self.deep = nn.Sequential(*layers)
        self.head = nn.Linear(self.width + previous, 1)

    def inputs(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        parts = [dense, *self.embeddings.fields(cat)]
        x0 = torch.cat(parts, dim=1) if parts else dense
        if x0.shape[1] == 0:
            x0 = torch.zeros(dense.shape[0], 1, dtype=dense.dtype, device=dense.device)
        return x0

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        x0 = self.inputs(dense, cat)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.head(torch.cat([x, self.deep(x0)], dim=1)).squeeze(-1)


def hparams(spec: BundleSpec) -> dict:
    return with_defaults(FINE_RANKING_PARAMS, spec.hparams)


def build(spec: BundleSpec) -> nn.Module:
    h = hparams(spec)
    return DCNv2(
        spec,
        embedding_dim=int(h["embedding_dim"]),
        cross_layers=int(h["cross_layers"]),
        hidden=h["hidden"],
        dropout=float(h["dropout"]),
    )
