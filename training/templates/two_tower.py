"""Recall: a two-tower model trained with in-batch negatives.

Features whose ``entity`` is ``item`` feed the item tower; every other feature (user, semantic,
context) feeds the user tower. Each tower embeds its categorical inputs (a list of categories:
the mean of its items' vectors, see ``training.templates.inputs``), concatenates its dense
inputs and maps them through an MLP to a normalised vector; the score is their dot product over
a temperature. Training (``training_loss``) takes the clicked rows of a batch and asks each user
to pick its own item among all the batch's items (softmax cross-entropy), so every other item in
the batch is a negative. ``forward(dense, cat)`` gives the pointwise score as a logit, which is
what serving and evaluation need.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from training.bundle import BundleSpec
from training.templates.inputs import FieldEmbedding
from training.templates.schemas import TWO_TOWER_PARAMS, with_defaults


def _columns(spec: BundleSpec, item: bool) -> tuple[list[int], list[int]]:
    """Dense column indices and categorical field indices (positions in
    ``spec.categorical_features``) of one tower."""
    dense_idx: list[int] = []
    offset = 0
    for feature in spec.dense_features:
        width = feature.dim if feature.dtype == "embedding" else 1
        if (feature.entity == "item") == item:
            dense_idx.extend(range(offset, offset + width))
        offset += width
    cat_idx = [i for i, f in enumerate(spec.categorical_features) if (f.entity == "item") == item]
    return dense_idx, cat_idx


class Tower(nn.Module):
    def __init__(self, spec, dense_idx, cat_idx, *, embedding_dim, hidden, out_dim) -> None:
        super().__init__()
        self.register_buffer("dense_idx", torch.tensor(dense_idx, dtype=torch.long))
        # Kept as a buffer (bundles saved before list fields hold it); ``embeddings`` reads the
        # fields' columns itself.
        self.register_buffer("cat_idx", torch.tensor(cat_idx, dtype=torch.long))
        self.embeddings = FieldEmbedding(spec, embedding_dim, fields=cat_idx)
        width = max(1, len(dense_idx) + embedding_dim * len(cat_idx))
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        parts = [dense.index_select(1, self.dense_idx), *self.embeddings.fields(cat)]
        x = torch.cat(parts, dim=1)
        if x.shape[1] == 0:
            x = torch.zeros(dense.shape[0], 1, dtype=dense.dtype, device=dense.device)
        return F.normalize(self.mlp(x), dim=-1)


class TwoTower(nn.Module):
    def __init__(self, spec: BundleSpec, h: dict) -> None:
        super().__init__()
        towers = {}
        for name, is_item in (("user", False), ("item", True)):
            dense_idx, cat_idx = _columns(spec, is_item)
            towers[name] = Tower(
                spec,
                dense_idx,
                cat_idx,
                embedding_dim=int(h["embedding_dim"]),
                hidden=int(h["hidden"]),
                out_dim=int(h["tower_dim"]),
            )
        self.user = towers["user"]
        self.item = towers["item"]
        self.temperature = float(h["temperature"])
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        score = (self.user(dense, cat) * self.item(dense, cat)).sum(-1)
        return score / self.temperature + self.bias

    def training_loss(self, dense, cat, label) -> torch.Tensor:
        positive = label > 0.5
        # The pointwise bias keeps logits on a click-probability scale for evaluation.
        pointwise = F.binary_cross_entropy_with_logits(self.forward(dense, cat), label)
        if int(positive.sum()) < 2:
            return pointwise
        users = self.user(dense[positive], cat[positive])
        items = self.item(dense[positive], cat[positive])
        logits = users @ items.T / self.temperature
        target = torch.arange(logits.shape[0], device=logits.device)
        return F.cross_entropy(logits, target) + pointwise


def build(spec: BundleSpec) -> nn.Module:
    h = with_defaults(TWO_TOWER_PARAMS, spec.hparams)
    return TwoTower(spec, h)
