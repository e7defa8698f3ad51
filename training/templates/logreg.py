"""Logistic regression: a linear model over dense inputs and one weight per categorical index
(a list field: the mean of its items' weights; see ``training.templates.inputs``).

For: the baseline every ranking model must beat, and a calibrated, explainable model where one is
enough. By default it is fitted as scikit-learn fits its ``LogisticRegression``: the convex loss
(mean log loss plus ``l2``/2 times the squared weights, the bias unpenalised) minimised to
convergence by full-batch L-BFGS (``training.runner.fit_convex``), so its result depends on ``l2``
alone, not on a learning rate, batch order or epoch count. ``solver: "adam"`` trains it by
minibatch steps with early stopping instead, as the deep templates are trained. Measured on the
quality bench (MovieLens 100K, time-ordered split): Adam steps with early stopping left it 0.009
of log loss behind scikit-learn's LR on the same rows; the convex fit closes that gap.
"""

from __future__ import annotations

import torch
from torch import nn

from training.bundle import BundleSpec
from training.templates.inputs import field_weights


class LogisticRegression(nn.Module):
    # The solver when the job names none (``training.runner.train`` reads it).
    default_solver = "lbfgs"

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


def build(spec: BundleSpec) -> nn.Module:
    return LogisticRegression(spec)
