"""The quantization bench's parts on a small run: the exported model scores as PyTorch does, the
int8 one close to it, the profiler's share of matrix products is a share, and the LM data has
structure a model can learn."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.areas import quantization
from bench.harness import Context


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.setattr(quantization, "WARMUP", 2)
    monkeypatch.setattr(quantization, "TIMED", 20)
    return Context(area="quantization", workdir=tmp_path)


@pytest.mark.django_db
def test_the_ranker_exports_faithfully_and_int8_stays_close(ctx):
    out = quantization.one_ranker(ctx, seed=3, scale=0.2, batch=50)
    assert out["auc_fp32"] == pytest.approx(out["auc_torch_fp32"], abs=1e-4)
    assert out["auc_torch_fp32"] == pytest.approx(out["auc_job"], abs=0.01)
    assert abs(out["auc_loss_int8"]) < 0.01 and abs(out["auc_loss_int8_static"]) < 0.02
    for suffix in ("", "_b500"):
        share = out[f"gemm_share_fp32{suffix}"]
        assert 0 < share < 1
        assert out[f"speedup_int8_bound{suffix}"] == pytest.approx(1 / (1 - share))
        assert out[f"p99_ms_int8{suffix}"] > 0
        expected = out[f"p99_ms_fp32{suffix}"] / out[f"p99_ms_int8{suffix}"]
        assert out[f"speedup_int8{suffix}"] == pytest.approx(expected)


def test_themarkov_sequences_follow_their_successors():
    rng = np.random.default_rng(0)
    sequences = quantization.markov_sequences(rng, 64, 200, 50)
    pairs = {(int(a), int(b)) for row in sequences for a, b in itertools.pairwise(row)}
    # each token leads to about 4 successors (plus 10% noise), far fewer than the 64 possible
    per_token = len(pairs) / 64
    assert 4 <= per_token < 20
