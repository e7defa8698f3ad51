"""DeepFM (Guo et al., 2017): a factorisation machine and a deep network on shared embeddings.

Every input field gets one ``embedding_dim``-wide vector, shared by the FM part and the deep
part. A categorical field looks its index up in its own table (a list of categories: the mean
of its items' vectors, see ``training.templates.inputs``). A numeric field (float, int,
bool; already normalised by the encoder) has one learned vector scaled by its value, as DeepCTR
and FuxiCTR embed dense fields; an embedding feature (a vector of ``dim`` numbers) is projected
to the same width by a learned matrix, which is the same rule for ``dim`` > 1. The logit is

    first order  bias + w . dense + sum of the categorical fields' own weights
  + FM           0.5 * sum_k ((sum_f v_fk)^2 - sum_f v_fk^2)   (all pairwise <v_i, v_j>)
  + DNN          an MLP over the concatenated field vectors.

Defaults follow the reference configurations (the paper and FuxiCTR: ``embedding_dim`` 10, ReLU,
no batch norm, no dropout) except ``hidden``: the paper's 400-400-400 is about 0.36M weights in
the MLP alone and took two to three times as long per step on one CPU thread as 128-64, with no
better held-out AUC on the synthetic demo log (16k training rows, 3 seeds: 0.783 against
0.796 on average), so the default is 128-64 (DeepCTR's own default is 256-128-64); give
``400,400,400`` for Criteo-sized data. ``embedding_l2`` is the reference
libraries' embedding regulariser (DeepCTR's ``l2_reg_embedding``, FuxiCTR's
``embedding_regularizer``): an L2 penalty on the embedding tables only, added to the loss, where
the shared ``weight_decay`` would decay every weight.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from training.bundle import BundleSpec
from training.templates.inputs import FieldEmbedding, field_weights
from training.templates.schemas import DEEPFM_PARAMS, with_defaults


class _BatchNorm(nn.BatchNorm1d):
    """Batch norm that uses its running statistics for a one-row batch in training, which
    ``BatchNorm1d`` refuses: the last batch of an epoch can hold a single row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] < 2:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        return super().forward(x)


class DeepFM(nn.Module):
    def __init__(
        self,
        spec: BundleSpec,
        *,
        embedding_dim: int,
        hidden: list[int],
        dropout: float,
        batch_norm: bool,
        embedding_l2: float,
    ) -> None:
        super().__init__()
        self.dense_widths = [f.dim if f.dtype == "embedding" else 1 for f in spec.dense_features]
        self.embedding_l2 = embedding_l2
        dense_dim = sum(self.dense_widths)
        # First order: one weight per dense column and per categorical id, one bias.
        self.bias = nn.Parameter(torch.zeros(1))
        self.linear = nn.Linear(dense_dim, 1, bias=False) if dense_dim else None
        self.cat_weights = field_weights(spec)
        # Field vectors: a table per categorical field, a projection per dense field.
        self.cat_embeddings = FieldEmbedding(spec, embedding_dim)
        self.dense_embeddings = nn.ModuleList(
            nn.Linear(width, embedding_dim, bias=False) for width in self.dense_widths
        )
        for table in self.cat_embeddings:
            nn.init.normal_(table.weight, std=0.05)
        for projection in self.dense_embeddings:
            nn.init.normal_(projection.weight, std=0.05)
        fields = len(self.cat_embeddings) + len(self.dense_widths)
        layers: list[nn.Module] = []
        previous = max(1, fields * embedding_dim)
        for size in hidden:
            layers.append(nn.Linear(previous, size))
            if batch_norm:
                layers.append(_BatchNorm(size))
            layers.append(nn.ReLU())
            if dropout:
                layers.append(nn.Dropout(dropout))
            previous = size
        layers.append(nn.Linear(previous, 1))
        self.deep = nn.Sequential(*layers)

    def fields(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        """The field vectors, ``[rows, fields, embedding_dim]``."""
        vectors = self.cat_embeddings.fields(cat)
        offset = 0
        for width, projection in zip(self.dense_widths, self.dense_embeddings, strict=True):
            vectors.append(projection(dense[:, offset : offset + width]))
            offset += width
        if not vectors:
            return dense.new_zeros(dense.shape[0], 1, 1)
        return torch.stack(vectors, dim=1)

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        first = self.bias.expand(dense.shape[0])
        if self.linear is not None:
            first = first + self.linear(dense).squeeze(-1)
        first = self.cat_weights.first_order(cat, first)
        v = self.fields(dense, cat)
        fm = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(v.flatten(start_dim=1)).squeeze(-1)
        return first + fm + deep

    def embedding_penalty(self) -> torch.Tensor:
        """The sum of squares of every embedding weight (the tables and the dense projections)."""
        total = self.bias.new_zeros(())
        for module in (*self.cat_embeddings, *self.dense_embeddings):
            total = total + module.weight.pow(2).sum()
        return total

    def training_loss(self, dense, cat, label) -> torch.Tensor:
        loss = F.binary_cross_entropy_with_logits(self.forward(dense, cat), label)
        if self.embedding_l2:
            loss = loss + self.embedding_l2 * self.embedding_penalty()
        return loss


def hparams(spec: BundleSpec) -> dict:
    return with_defaults(DEEPFM_PARAMS, spec.hparams)


def build(spec: BundleSpec) -> nn.Module:
    h = hparams(spec)
    return DeepFM(
        spec,
        embedding_dim=int(h["embedding_dim"]),
        hidden=h["hidden"],
        dropout=float(h["dropout"]),
        batch_norm=bool(h["batch_norm"]),
        embedding_l2=float(h["embedding_l2"]),
    )
