"""Exact and near-duplicate detection against brute-force Jaccard on generated text."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pyarrow as pa
import pytest

from curation.dedup import choose_bands, find_duplicates, jaccard, normalised_hashes, words

WORD = re.compile(r"[a-z0-9\x80-\U0010ffff]+")


def shingle_set(text: str | None, size: int = 3) -> set[tuple[str, ...]]:
    """The reference: Python's regex and sets, independent of the vectorised code."""
    found = WORD.findall((text or "").lower().encode("utf-8", "surrogatepass").decode("utf-8"))
    if 0 < len(found) < size:
        return {tuple(found)}
    return {tuple(found[i : i + size]) for i in range(len(found) - size + 1)}


def brute_jaccard(a: str, b: str, size: int = 3) -> float:
    x, y = shingle_set(a, size), shingle_set(b, size)
    return len(x & y) / len(x | y) if x | y else 0.0


def corpus(seed: int, rows: int = 1500) -> tuple[list[str], list[tuple[int, int]]]:
    """Random texts over a Zipf vocabulary (with accented words), then planted copies: exact ones
    with case, spacing and punctuation changed, and near ones with 0-15% of words replaced."""
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}{'éab'[i % 3]}" for i in range(3000)]
    weights = 1 / np.arange(1, 3001) ** 1.1
    weights /= weights.sum()
    texts = [
        " ".join(rng.choice(vocabulary, size=int(rng.integers(8, 80)), p=weights))
        for _ in range(rows)
    ]
    planted = []
    for _ in range(rows // 3):
        source = int(rng.integers(rows))
        words_of = texts[source].split()
        if rng.random() < 0.4:
            copy = "  ".join(w.upper() + ("," if rng.random() < 0.3 else "") for w in words_of)
        else:
            rate = rng.uniform(0, 0.15)
            copy = " ".join(
                str(rng.choice(vocabulary)) if rng.random() < rate else w for w in words_of
            )
        planted.append((source, len(texts)))
        texts.append(copy)
    return texts, planted


def _root(found, row: int) -> int:
    for owner in (found.exact_of, found.near_of):
        if owner[row] >= 0:
            return int(owner[row])
    return row


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_pair_reported_is_above_the_threshold_and_every_planted_pair_above_it_is_found(seed):
    texts, planted = corpus(seed)
    found = find_duplicates(pa.array(texts), threshold=0.7)
    for (a, b), similarity in zip(found.pairs, found.similarity, strict=True):
        assert similarity == pytest.approx(brute_jaccard(texts[a], texts[b]))
        assert similarity >= 0.7
    above = [(a, b) for a, b in planted if brute_jaccard(texts[a], texts[b]) >= 0.7]
    assert len(above) > 100
    missed = [(a, b) for a, b in above if _root(found, a) != _root(found, b)]
    assert missed == []
    # a dropped row's kept row is never itself dropped
    kept = np.flatnonzero(found.keep)
    owners = np.concatenate(
        [found.exact_of[found.exact_of >= 0], found.near_of[found.near_of >= 0]]
    )
    assert set(owners.tolist()) <= set(kept.tolist())
    assert found.keep.sum() + (found.exact_of >= 0).sum() + (found.near_of >= 0).sum() == len(texts)


def test_exact_duplicates_ignore_case_spacing_and_punctuation_but_not_word_order():
    texts = [
        "Hello, World! again",
        "hello world again",
        "  HELLO   world...again ",
        "world hello again",
        None,
        "",
    ]
    found = find_duplicates(pa.array(texts), near=False)
    assert found.exact_of.tolist() == [-1, 0, 0, -1, -1, 4]  # null and empty are the same text
    assert found.keep.tolist() == [True, False, False, True, True, False]


def test_the_result_does_not_depend_on_how_the_text_is_chunked():
    texts, _ = corpus(4, rows=600)
    column = pa.array(texts)
    whole = find_duplicates(column, threshold=0.6)
    chunked = find_duplicates(column, threshold=0.6, chunk_bytes=777)
    assert whole.keep.tolist() == chunked.keep.tolist()
    assert whole.near_of.tolist() == chunked.near_of.tolist()
    large = pa.array(texts, type=pa.large_string())
    assert find_duplicates(large, threshold=0.6).keep.tolist() == whole.keep.tolist()
    # a sliced array (an offset into its buffers) reads the same rows
    sliced = pa.array(["padding row", *texts])[1:]
    assert find_duplicates(sliced, threshold=0.6).keep.tolist() == whole.keep.tolist()


def test_words_follow_the_reference_tokeniser_on_unicode_and_short_rows():
    texts = ["Ça va? ÇA VA!", "a", "", "x-y_z 42", "naïve café — déjà vu"]
    found = words(pa.array(texts))
    counts = np.bincount(found.rows, minlength=len(texts)).tolist()
    assert counts == [len(WORD.findall(t.lower())) for t in texts]
    pairs = np.array(list(itertools.combinations(range(len(texts)), 2)))
    exact = jaccard(pa.array(texts), pairs, shingle=2)
    assert exact.tolist() == pytest.approx([brute_jaccard(texts[a], texts[b], 2) for a, b in pairs])
    hashes = normalised_hashes(pa.array(["ça va", "ÇA VA", "ca va"]))
    assert hashes[0] == hashes[1]  # case is folded by Unicode's rules
    assert hashes[0] != hashes[2]  # accents are kept


def test_bands_reach_the_recall_asked_for_at_the_threshold():
    for threshold in (0.5, 0.7, 0.8, 0.9):
        bands = choose_bands(128, threshold)
        rows = 128 // bands
        assert 1 - (1 - threshold**rows) ** bands >= 0.995
        if rows < 128:  # one more bin per band would miss the recall
            wider = next(r for r in range(rows + 1, 129) if 128 % r == 0)
            assert 1 - (1 - threshold**wider) ** (128 // wider) < 0.995


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        find_duplicates(pa.array(["a"]), threshold=0)
    with pytest.raises(ValueError, match="bands"):
        find_duplicates(pa.array(["a"]), bands=3)
    with pytest.raises(TypeError, match="string"):
        find_duplicates(pa.array([1, 2]))
