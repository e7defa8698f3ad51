"""Data building: exact and near-duplicate removal and the filter, scrub and format stages on a
generated corpus with planted duplicates, against datasketch's MinHash LSH.

Corpus (``corpus``, one per seed of ``BENCH_DATA_SEEDS``, default ``0,1,2``; ``BENCH_DATA_ROWS``
records each, default 200,000): documents of 10 to 400 words (log-uniform) drawn from a
Zipf(1.1) vocabulary of 50,000 words, a tenth of them with accented letters; then rows for the
filters (3% of one to three words, 2% mostly symbols, 2% one line repeated, 3% with an e-mail
address or a phone number put in); then planted duplicates of random documents: 8% exact
copies with case, spacing and punctuation changed, and 12% near copies with a share of words
replaced, dropped or inserted drawn from U(0, 0.15), so the planted pairs span Jaccard
similarities on both sides of the threshold (0.8, 3-word shingles).

Measures (each the median over the seeds; ``_min`` and ``_max`` the spread):

- ``dedup_rows_per_s``: rows / wall time of ``curation.dedup.find_duplicates`` on the text
  column (exact, then near), as the ``dedup`` stage runs it.
- ``near_dup_recall``: of the planted near pairs whose Jaccard similarity, computed by brute force
  in Python (regex words, sets of shingles; independent of the vectorised code), reaches the
  threshold, the share that ours puts in one cluster; ``exact_dup_recall`` likewise for the
  planted exact copies.
- ``near_dup_precision``: of the pairs ours reports, the share whose brute-force Jaccard reaches
  the threshold; ``near_dup_drop_precision``: of the rows ours drops as near duplicates, the
  share whose kept row is within the threshold by brute force (a chain of similar rows can drop
  a row for a row it is not itself close to).
- ``pipeline_rows_per_s``: the whole pipeline (filter, scrub, dedup, format to instructions) as
  ``curation.stages.run`` runs it; ``filter_<rule>_removed``, ``scrub_<pattern>_changed``,
  ``dedup_removed_exact`` and ``dedup_removed_near``: its counts (the median over the seeds).
- ``peer_datasketch_rows_per_s``, ``peer_datasketch_recall``, ``peer_datasketch_precision`` on
  the first ``BENCH_DATA_PEER_ROWS`` rows (default 20,000) of each corpus, where datasketch 2.0
  (``MinHash.bulk``, ``MinHashLSH`` with an insertion session, pairs kept by the MinHash
  estimate) runs in ``bench/.venvs/datasketch``, and ``ours_subset_rows_per_s`` /
  ``ours_subset_recall`` / ``ours_subset_precision`` for ours on the same rows;
  ``speedup_vs_datasketch`` the ratio of the two speeds.

Goals (from the issue): recall >= 0.95 and precision >= 0.95 at the threshold, and >= 50,000
rows/s on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness import BenchError, Context, peer_venv

THRESHOLD = 0.8
SHINGLE = 3
PERMUTATIONS = 128
VOCABULARY = 50_000
PEER_DIR = Path(__file__).with_name("data_peer")
WORD = re.compile(r"[a-z0-9\x80-\U0010ffff]+")
PIPELINE = [
    {
        "kind": "filter",
        "field": "text",
        "rules": [
            {"rule": "min_words", "value": 5},
            {"rule": "symbol_ratio", "max": 0.3},
            {"rule": "repeated_lines", "max": 0.3},
            {"rule": "alpha_ratio", "min": 0.5},
        ],
    },
    {"kind": "scrub", "field": "text", "patterns": ["email", "phone"]},
    {"kind": "dedup", "field": "text", "threshold": THRESHOLD, "shingle": SHINGLE},
    {"kind": "format", "to": "instruction", "instruction": "title", "output": "text"},
]


def _vocabulary(rng: np.random.Generator) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(3, 10, VOCABULARY)
    words = ["".join(rng.choice(letters, n)) for n in lengths]
    accented = rng.random(VOCABULARY) < 0.1
    return np.array([w[:-1] + "é" if a else w for w, a in zip(words, accented, strict=True)])


def corpus(rows: int, seed: int) -> dict[str, Any]:
    """The texts and what was planted: (source, copy) pairs, exact and near."""
    rng = np.random.default_rng(seed)
    vocabulary = _vocabulary(rng)
    weights = 1 / np.arange(1, VOCABULARY + 1) ** 1.1
    weights /= weights.sum()
    shares = {
        "short": 0.03,
        "symbols": 0.02,
        "repeated": 0.02,
        "pii": 0.03,
        "exact": 0.08,
        "near": 0.12,
    }
    planted_rows = {k: int(rows * v) for k, v in shares.items()}
    base = rows - sum(planted_rows.values())
    lengths = np.exp(rng.uniform(np.log(10), np.log(400), base)).astype(int)
    words = rng.choice(VOCABULARY, size=int(lengths.sum()), p=weights)
    cuts = np.concatenate(([0], np.cumsum(lengths)))
    documents = [words[cuts[i] : cuts[i + 1]] for i in range(base)]
    texts = [" ".join(vocabulary[d]) for d in documents]
    for _ in range(planted_rows["short"]):
        texts.append(" ".join(vocabulary[rng.integers(0, 200, rng.integers(1, 4))]))
    for _ in range(planted_rows["symbols"]):
        texts.append(
            " ".join(["###"] * int(rng.integers(5, 20)) + list(vocabulary[rng.integers(0, 500, 3)]))
        )
    for _ in range(planted_rows["repeated"]):
        line = " ".join(vocabulary[rng.integers(0, 5000, 8)])
        texts.append("\n".join([line] * int(rng.integers(3, 8))))
    for i in range(planted_rows["pii"]):
        source = documents[int(rng.integers(base))]
        contact = (
            f"mail me at user{i}@example.com"
            if i % 2
            else f"call 555 {i % 1000:03d} {i % 10000:04d}"
        )
        texts.append(" ".join(vocabulary[source]) + " " + contact)
    pool = rng.choice(VOCABULARY, size=1 << 20, p=weights)  # Zipf draws for the edits
    exact, near = [], []
    for _ in range(planted_rows["exact"]):
        source = int(rng.integers(base))
        copy = "  ".join(
            w.upper() + ("," if rng.random() < 0.2 else "") for w in texts[source].split()
        )
        exact.append((source, len(texts)))
        texts.append(copy)
    for _ in range(planted_rows["near"]):
        source = int(rng.integers(base))
        rate = rng.uniform(0, 0.15)
        words_of = documents[source]
        roll = rng.random(len(words_of))
        drawn = pool[rng.integers(0, len(pool), len(words_of))]
        replaced = np.where((roll >= rate / 3) & (roll < 2 * rate / 3), drawn, words_of)
        inserted = roll > 1 - rate / 3
        edited = np.empty(len(words_of) + int(inserted.sum()), dtype=np.int64)
        # each word, then a drawn word after it where one is inserted; dropped ones left out
        place = np.arange(len(words_of)) + np.concatenate(([0], np.cumsum(inserted)[:-1]))
        edited[place] = replaced
        edited[place[inserted] + 1] = pool[rng.integers(0, len(pool), int(inserted.sum()))]
        kept = np.ones(len(edited), dtype=bool)
        kept[place[roll < rate / 3]] = False
        near.append((source, len(texts)))
        texts.append(" ".join(vocabulary[edited[kept]]))
    titles = [t[:40] for t in texts]
    return {"texts": texts, "titles": titles, "exact": exact, "near": near}


def shingle_set(text: str | None) -> set[tuple[str, ...]]:
    found = WORD.findall((text or "").lower())
    if 0 < len(found) < SHINGLE:
        return {tuple(found)}
    return {tuple(found[i : i + SHINGLE]) for i in range(len(found) - SHINGLE + 1)}


def brute_jaccard(texts: list[str], pairs) -> np.ndarray:
    cache: dict[int, set] = {}

    def of(i: int) -> set:
        if i not in cache:
            cache[i] = shingle_set(texts[i])
        return cache[i]

    out = []
    for a, b in pairs:
        x, y = of(int(a)), of(int(b))
        union = len(x | y)
        out.append(len(x & y) / union if union else 0.0)
    return np.array(out)


def _root(found, row: int) -> int:
    for owner in (found.exact_of, found.near_of):
        if owner[row] >= 0:
            return int(owner[row])
    return row


def score(texts: list[str], found, planted_near, planted_exact) -> dict[str, float]:
    """Recall on the planted pairs and precision of what was reported, by brute force."""
    similarity = brute_jaccard(texts, planted_near)
    above = [pair for pair, s in zip(planted_near, similarity, strict=True) if s >= THRESHOLD]
    hit = sum(_root(found, a) == _root(found, b) for a, b in above)
    exact_hit = sum(_root(found, a) == _root(found, b) for a, b in planted_exact)
    reported = brute_jaccard(texts, found.pairs) if len(found.pairs) else np.zeros(0)
    dropped = np.flatnonzero(found.near_of >= 0)
    drop_similarity = brute_jaccard(texts, [(i, found.near_of[i]) for i in dropped])
    return {
        "near_pairs_planted_above": len(above),
        "near_dup_recall": hit / len(above) if above else 1.0,
        "exact_dup_recall": exact_hit / len(planted_exact) if planted_exact else 1.0,
        "near_dup_precision": float((reported >= THRESHOLD - 1e-9).mean())
        if len(reported)
        else 1.0,
        "near_dup_drop_precision": (
            float((drop_similarity >= THRESHOLD - 1e-9).mean()) if len(dropped) else 1.0
        ),
    }


def pair_scores(texts: list[str], pairs: np.ndarray, planted_near) -> dict[str, float]:
    """Recall and precision of a set of reported pairs (the peer's), with the same rules."""
    similarity = brute_jaccard(texts, planted_near)
    above = [
        tuple(sorted(p)) for p, s in zip(planted_near, similarity, strict=True) if s >= THRESHOLD
    ]
    # a pair counts as found when both rows are in one component of the reported pairs
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(texts)
    if len(pairs):
        graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
        _, label = connected_components(graph, directed=False)
    else:
        label = np.arange(n)
    hit = sum(label[a] == label[b] for a, b in above)
    reported = brute_jaccard(texts, pairs) if len(pairs) else np.zeros(0)
    return {
        "recall": hit / len(above) if above else 1.0,
        "precision": float((reported >= THRESHOLD - 1e-9).mean()) if len(reported) else 1.0,
    }


def run_peer(ctx: Context, texts: list[str], name: str) -> dict[str, Any]:
    requirements = [
        line.strip()
        for line in (PEER_DIR / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    python = peer_venv("datasketch", requirements)
    path = ctx.workdir / f"{name}.parquet"
    pq.write_table(pa.table({"text": texts}), path)
    spec = {
        "texts": str(path),
        "threshold": THRESHOLD,
        "permutations": PERMUTATIONS,
        "shingle": SHINGLE,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    done = subprocess.run(
        [str(python), str(PEER_DIR / "driver.py"), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
        check=False,
    )
    if done.returncode:
        raise BenchError(f"the datasketch peer failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_seed(ctx: Context, rows: int, seed: int, peer_rows: int) -> dict[str, float]:
    from curation import dedup, stages

    started = time.perf_counter()
    made = corpus(rows, seed)
    texts = made["texts"]
    ctx.log(f"seed {seed}: {len(texts)} rows generated in {time.perf_counter() - started:.1f} s")
    column = pa.array(texts, pa.string())
    dedup.find_duplicates(column[:2000], threshold=THRESHOLD)  # warm the caches, untimed
    started = time.perf_counter()
    found = dedup.find_duplicates(column, threshold=THRESHOLD, shingle=SHINGLE)
    seconds = time.perf_counter() - started
    out: dict[str, float] = {"dedup_rows_per_s": len(texts) / seconds}
    out.update(score(texts, found, made["near"], made["exact"]))
    ctx.log(
        f"seed {seed}: dedup {seconds:.2f} s ({out['dedup_rows_per_s']:,.0f} rows/s), "
        f"recall {out['near_dup_recall']:.4f} of {out['near_pairs_planted_above']} pairs, "
        f"precision {out['near_dup_precision']:.4f}, candidates {found.candidates}"
    )

    table = pa.table({"title": pa.array(made["titles"], pa.string()), "text": column})
    checked = stages.validate(PIPELINE, table.schema)
    started = time.perf_counter()
    _, reports = stages.run(table, checked)
    out["pipeline_rows_per_s"] = len(texts) / (time.perf_counter() - started)
    for label, count in reports[0].removed.items():
        out[f"filter_{label.split()[0]}_removed"] = count
    for label, count in reports[1].changed.items():
        if label != "rows":
            out[f"scrub_{label.split()[0]}_changed"] = count
    out["dedup_removed_exact"] = reports[2].removed["exact duplicate"]
    out["dedup_removed_near"] = reports[2].removed["near duplicate"]

    if peer_rows:
        # the planted copies sit at the end: a subset keeps the pairs whose rows are both in it,
        # so it is made of the originals' head and the copies' tail
        keep = peer_rows // 2
        picked = list(range(keep)) + list(range(len(texts) - (peer_rows - keep), len(texts)))
        index = {row: i for i, row in enumerate(picked)}
        subset = [texts[i] for i in picked]
        near = [(index[a], index[b]) for a, b in made["near"] if a in index and b in index]
        peer = run_peer(ctx, subset, f"peer-{seed}")
        peer_pairs = np.array(peer["pairs"], dtype=np.int64).reshape(-1, 2)
        scored = pair_scores(subset, peer_pairs, near)
        out["peer_datasketch_rows_per_s"] = len(subset) / peer["seconds"]
        out["peer_datasketch_recall"] = scored["recall"]
        out["peer_datasketch_precision"] = scored["precision"]
        started = time.perf_counter()
        ours = dedup.find_duplicates(
            pa.array(subset, pa.string()), threshold=THRESHOLD, exact=False
        )
        out["ours_subset_rows_per_s"] = len(subset) / (time.perf_counter() - started)
        scored = pair_scores(subset, ours.pairs, near)
        out["ours_subset_recall"] = scored["recall"]
        out["ours_subset_precision"] = scored["precision"]
        out["speedup_vs_datasketch"] = (
            out["ours_subset_rows_per_s"] / out["peer_datasketch_rows_per_s"]
        )
        ctx.log(
            f"seed {seed}: datasketch {out['peer_datasketch_rows_per_s']:,.0f} rows/s "
            f"(recall {out['peer_datasketch_recall']:.4f}), "
            f"ours {out['ours_subset_rows_per_s']:,.0f} rows/s "
            f"on {len(subset)} rows ({len(near)} planted near pairs)"
        )
    return out


def run(ctx: Context) -> dict[str, float]:
    rows = int(os.environ.get("BENCH_DATA_ROWS", "200000"))
    seeds = [int(s) for s in os.environ.get("BENCH_DATA_SEEDS", "0,1,2").split(",") if s.strip()]
    peer_rows = int(os.environ.get("BENCH_DATA_PEER_ROWS", "20000"))
    ctx.parameters.update(
        {
            "rows": rows,
            "seeds": seeds,
            "peer_rows": peer_rows,
            "threshold": THRESHOLD,
            "shingle": SHINGLE,
            "permutations": PERMUTATIONS,
            "cores": os.cpu_count(),
            "pipeline": PIPELINE,
        }
    )
    runs = [one_seed(ctx, rows, seed, peer_rows) for seed in seeds]
    ctx.parameters["per_seed"] = runs
    measures: dict[str, float] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if key in r]
        measures[key] = statistics.median(values)
        if len(values) > 1 and key.endswith(("_per_s", "_recall", "_precision")):
            measures[f"{key}_min"] = min(values)
            measures[f"{key}_max"] = max(values)
    ctx.parameters["goals"] = {
        "near_dup_recall >= 0.95": measures[
            "near_dup_recall_min" if len(runs) > 1 else "near_dup_recall"
        ]
        >= 0.95,
        "near_dup_precision >= 0.95": measures[
            "near_dup_precision_min" if len(runs) > 1 else "near_dup_precision"
        ]
        >= 0.95,
        "dedup_rows_per_s >= 50000": measures[
            "dedup_rows_per_s_min" if len(runs) > 1 else "dedup_rows_per_s"
        ]
        >= 50_000,
    }
    return measures
