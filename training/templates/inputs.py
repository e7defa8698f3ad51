"""The categorical inputs every built-in template shares: one embedding table per field.

``FeatureEncoder`` gives a template the ``cat`` matrix: one column per single-valued field (its
vocabulary index or hash bucket, 0 for null) and ``slots`` columns per ``categorical_list``
field (its items' indices, 0 for padding). ``FieldEmbedding`` turns it into one vector per
field, ``[rows, fields, dim]``: a single-valued field's table row (index 0, null, has its own
learned row, as before lists existed), a list field's mean over its non-padding slots (DeepCTR's
and FuxiCTR's mean pooling of sequence fields; an empty list gives zeros). ``field_weights``
builds the same with ``dim`` 1 and zero initial weights: the per-field first-order weights of
logistic regression and DeepFM.

``FieldEmbedding`` is an ``nn.ModuleList`` of the tables, so a template's state-dict keys are
what they were when it held that list itself (``embeddings.0.weight``): bundles saved before
this module load unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from training.bundle import CATEGORICAL_LIST, BundleSpec, categorical_columns


class FieldEmbedding(nn.ModuleList):
    """Per-field embeddings of the ``cat`` matrix, ``[rows, fields, dim]``.

    ``fields`` picks categorical fields by their position in ``spec.categorical_features``
    (the two-tower model's towers each embed their own); default: all of them. ``forward`` takes
    the whole ``cat`` matrix."""

    def __init__(self, spec: BundleSpec, dim: int, *, fields: Sequence[int] | None = None) -> None:
        columns = categorical_columns(spec)
        chosen = range(len(columns)) if fields is None else list(fields)
        super().__init__(nn.Embedding(columns[i][0].buckets + 1, dim) for i in chosen)
        self.dim = dim
        # (first column, width, pooled) per field: plain ints, not buffers (no state-dict keys).
        self.columns = [
            (columns[i][1], columns[i][0].slots, columns[i][0].dtype == CATEGORICAL_LIST)
            for i in chosen
        ]

    def field(self, cat: torch.Tensor, k: int) -> torch.Tensor:
        """Field ``k``'s vectors, ``[rows, dim]``."""
        start, width, pooled = self.columns[k]
        table = self[k]
        if not pooled:
            return table(cat[:, start])
        ids = cat[:, start : start + width]
        mask = (ids != 0).unsqueeze(-1).to(table.weight.dtype)
        total = (table(ids) * mask).sum(dim=1)
        return total / mask.sum(dim=1).clamp(min=1.0)

    def fields(self, cat: torch.Tensor) -> list[torch.Tensor]:
        """Each field's ``[rows, dim]`` vectors, in field order."""
        return [self.field(cat, k) for k in range(len(self))]

    def forward(self, cat: torch.Tensor) -> torch.Tensor:
        vectors = self.fields(cat)
        if not vectors:
            return cat.new_zeros((cat.shape[0], 0, self.dim), dtype=torch.float32)
        return torch.stack(vectors, dim=1)

    def first_order(self, cat: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """``start`` plus every field's weight (a ``dim`` 1 table), ``[rows]``, added one field
        at a time (the order the templates always summed in, so their logits are unchanged)."""
        out = start
        for k in range(len(self)):
            out = out + self.field(cat, k).squeeze(-1)
        return out


def field_weights(spec: BundleSpec, *, fields: Sequence[int] | None = None) -> FieldEmbedding:
    """Per-field first-order weights (``dim`` 1), starting at zero."""
    weights = FieldEmbedding(spec, 1, fields=fields)
    for table in weights:
        nn.init.zeros_(table.weight)
    return weights


class Averaged(nn.Module):
    """Networks of one template (``members``, or the folds' models of ``cv_folds``) whose
    logits are averaged: the model of such a run, each member trained on its own
    (``training.runner.train_members``)."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(dense, cat) for m in self.members]).mean(dim=0)
