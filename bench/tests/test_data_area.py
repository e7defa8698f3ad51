"""The data bench's corpus and scoring: what it plants is what it claims, and the scores move
when the duplicates are or are not found."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bench.areas import data
from curation import dedup


def test_the_corpus_plants_exact_copies_and_near_copies_on_both_sides_of_the_threshold():
    made = data.corpus(4000, seed=7)
    texts = made["texts"]
    assert len(texts) == 4000 == len(made["titles"])
    assert len(made["exact"]) == 320 and len(made["near"]) == 480
    hashes = dedup.normalised_hashes(pa.array(texts))
    assert all(hashes[a] == hashes[b] and texts[a] != texts[b] for a, b in made["exact"])
    similarity = data.brute_jaccard(texts, made["near"])
    assert 0.2 < (similarity >= data.THRESHOLD).mean() < 0.9
    assert similarity.min() < 0.5
    # rows for each filter rule are there
    assert sum(len(t.split()) < 4 for t in texts) >= 120
    assert sum("###" in t for t in texts) == 80
    assert sum("@example.com" in t for t in texts) == 60
    # the same seed makes the same corpus; another seed another
    assert data.corpus(4000, seed=7)["texts"] == texts
    assert data.corpus(4000, seed=8)["texts"] != texts


def test_scores_count_missed_pairs_and_reported_pairs_below_the_threshold():
    made = data.corpus(3000, seed=3)
    texts = made["texts"]
    found = dedup.find_duplicates(pa.array(texts), threshold=data.THRESHOLD)
    scored = data.score(texts, found, made["near"], made["exact"])
    assert scored["near_dup_recall"] >= 0.95 and scored["near_dup_precision"] == 1.0
    assert scored["exact_dup_recall"] == 1.0
    nothing = dedup.find_duplicates(pa.array(texts), exact=False, near=False)
    missed = data.score(texts, nothing, made["near"], made["exact"])
    assert missed["near_dup_recall"] == 0.0 and missed["exact_dup_recall"] == 0.0
    # a reported pair far below the threshold lowers the precision
    below = [(a, b) for a, b in made["near"] if data.brute_jaccard(texts, [(a, b)])[0] < 0.5][:5]
    assert len(below) == 5
    pairs = np.array(below + [tuple(p) for p in found.pairs[:5]], dtype=np.int64)
    assert data.pair_scores(texts, pairs, made["near"])["precision"] == 0.5
