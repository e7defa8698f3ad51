"""Exact and near-duplicate detection over a text column, vectorised over Arrow buffers.

Exact duplicates: the text normalised (lowercased by Unicode's rules with Arrow's
``utf8_lower``, every run of ASCII characters that are neither letters nor digits read as one
separator, so case, spacing and punctuation do not count) hashed to 64 bits; the first row of
each hash is kept.

Near duplicates: MinHash over word shingles (``shingle`` consecutive words) with locality-
sensitive banding, as Broder's resemblance estimate and datasketch's ``MinHashLSH`` do, computed
for all rows at once instead of one row at a time:

- words and their 64-bit hashes come from the UTF-8 buffer itself (a byte lookup table, then a
  polynomial hash from prefix sums), never a Python string per row;
- the signature is one-permutation MinHash (Li, Owen and Zhang 2012): each shingle's hash picks
  one of ``permutations`` bins by its top bits and the bin keeps its least value; empty bins are
  filled from another bin chosen by a hash of the empty bin's number (optimal densification,
  Shrivastava 2017), so two rows agree on a bin with probability close to their Jaccard similarity;
- ``bands`` bands of ``permutations / bands`` bins are hashed (by default the fewest bands that
  make a pair at the threshold a candidate with probability 0.999); rows sharing a band's hash
  are candidates, and a candidate pair is kept when the exact Jaccard similarity of the two
  rows' shingle sets (recomputed for the candidate rows only) reaches ``threshold``, so no pair
  below it is ever reported; rows joined by kept pairs form clusters (connected components)
  whose first row is kept.

Why by hand: datasketch (2.0.0, the maintained library) hashes one row at a time in Python.
On the data bench's corpus (``make bench ONLY=data``, 3 seeds, this machine's 2 cores) its
``MinHash.bulk`` and ``MinHashLSH`` ran at 3,000-5,800 rows/s on 20,000 rows and found 83-89% of
the planted pairs at the threshold (precision 0.955-0.970, by its MinHash estimate); this code ran
at 54,000-80,000 rows/s on the same rows with recall and precision 1.0 (exact confirmation), and
at 52,900-61,200 rows/s on the whole 200,000 rows (exact and near; two runs of the 3 seeds).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

U64 = np.uint64
_P = 0x100000001B3 | 1  # the FNV prime: odd, so it has an inverse modulo 2**64
_P_INV = pow(_P, -1, 2**64)
_EMPTY = np.iinfo(np.uint64).max
# Rows are hashed a run at a time, up to this much text: it bounds the working memory (about 40
# bytes per byte of text) and the cached powers of the word hash.
CHUNK_BYTES = 4 << 20


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 whose output bits all depend on every input
    bit (so top bits and band hashes are uniform)."""
    x = x ^ (x >> U64(30))
    x = x * U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> U64(27))
    x = x * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


@dataclass(frozen=True)
class Words:
    """The words of a run of rows: each word's 64-bit hash and the row it belongs to (rows in
    order, words in row order)."""

    hashes: np.ndarray  # uint64
    rows: np.ndarray  # int64, relative to the first row of the run
    row_count: int


def _string_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets relative to the first row, UTF-8 bytes) of a string array; nulls are empty."""
    width: np.dtype[Any]
    if pa.types.is_large_string(column.type):
        width = np.dtype(np.int64)
    elif pa.types.is_string(column.type):
        width = np.dtype(np.int32)
    else:
        raise TypeError(f"a text column must be a string column, not {column.type}")
    if column.null_count:
        column = column.fill_null("")
    offsets_buffer, data_buffer = column.buffers()[1], column.buffers()[2]
    offsets = np.frombuffer(offsets_buffer, dtype=width)[
        column.offset : column.offset + len(column) + 1
    ].astype(np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[start:stop]
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return offsets - start, data


_cache_lock = threading.RLock()  # runs are hashed on threads
_power_cache: list[np.ndarray] = [np.ones(1, dtype=U64), np.ones(1, dtype=U64)]


def _powers(length: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i modulo 2**64 for i < length, computed once and kept (a chunk of text is
    at most ``CHUNK_BYTES``, so the cache stays about 2 x 8 x CHUNK_BYTES)."""
    with _cache_lock:
        have = len(_power_cache[0])
        if have < length:
            size = max(length, 2 * have, CHUNK_BYTES + 1)
            for k, base in enumerate((_P, _P_INV)):
                grown = np.empty(size, dtype=U64)
                grown[0] = 1
                np.cumprod(np.full(size - 1, base, dtype=U64), out=grown[1:])
                _power_cache[k] = grown
        return _power_cache[0], _power_cache[1]


_buffers = threading.local()


def _prefix_buffer(length: int) -> np.ndarray:
    """A uint64 scratch array of ``length`` that this thread reuses from run to run."""
    held = getattr(_buffers, "prefix", None)
    if held is None or len(held) < length:
        held = _buffers.prefix = np.empty(max(length, CHUNK_BYTES + 1), dtype=U64)
    return held[:length]


def words(column: pa.Array) -> Words:
    """Each row's normalised words as hashes: a word is a maximal run of letters, digits and
    non-ASCII characters, the text lowercased (Unicode's rules) first."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise TypeError(f"a text column must be a string column, not {column.type}")
    offsets, data = _string_parts(pc.utf8_lower(column))
    rows = len(offsets) - 1
    # utf8_lower has lowercased ASCII letters already, so a word's bytes hash as they are; the
    # class test is arithmetic on the bytes (a table lookup, a gather, took 4x as long).
    is_word = (data >= 0x80) | ((data | 0x20) - np.uint8(ord("a")) < 26)
    is_word |= data - np.uint8(ord("0")) < 10
    size = len(data)
    row_start = np.zeros(size + 1, dtype=bool)
    row_start[offsets[:-1][offsets[:-1] < size]] = True
    before = np.concatenate(([False], is_word))  # is_word[i-1], False at 0
    after = np.concatenate((is_word, [False]))  # is_word[i], False at the end
    starts = np.flatnonzero(after & (~before | row_start))
    ends = np.flatnonzero(before & (~after | row_start))
    if not len(starts):
        return Words(np.zeros(0, dtype=U64), np.zeros(0, dtype=np.int64), rows)
    # The word hash: sum of byte * P**i over its bytes, shifted to start at P**0. The prefix
    # sums go to a buffer the thread keeps (a fresh one per run was a third of this function's
    # time, in page faults).
    powers, inverse_powers = _powers(size + 1)
    prefix = _prefix_buffer(size + 1)
    prefix[0] = 0
    np.multiply(data, powers[:size], out=prefix[1:])
    np.cumsum(prefix[1:], out=prefix[1:])
    hashed = mix64((prefix[ends] - prefix[starts]) * inverse_powers[starts])
    # each row's words are a run of ``starts``: one search per row, not one per word
    owner = np.repeat(np.arange(rows), np.diff(np.searchsorted(starts, offsets)))
    return Words(hashed, owner.astype(np.int64), rows)


def shingles(found: Words, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(shingle hashes, their rows): every run of ``size`` consecutive words of a row, and one
    shingle of all its words for a row with fewer; rows without words have none."""
    hashes, rows = found.hashes, found.rows
    n = len(hashes)
    if n == 0:
        return hashes, rows
    combined = hashes.copy()
    same = np.ones(n, dtype=bool)
    for k in range(1, size):
        nxt = np.zeros(n, dtype=U64)
        nxt[: n - k] = hashes[k:]
        in_row = np.zeros(n, dtype=bool)
        in_row[: n - k] = rows[k:] == rows[: n - k]
        combined = combined * U64(0x9E3779B97F4A7C15) + np.where(in_row, nxt, U64(0))
        same &= in_row
    first = np.ones(n, dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    counts = np.bincount(rows, minlength=found.row_count)
    short = counts[rows] < size
    keep = same | (first & short)
    return mix64(combined[keep]), rows[keep]


def signatures(found: Words, *, permutations: int, shingle: int) -> np.ndarray:
    """One-permutation MinHash signatures, densified: (rows, permutations) uint64; a row with no
    words is all ``_EMPTY``."""
    bits = permutations.bit_length() - 1
    if permutations != 1 << bits:
        raise ValueError("permutations must be a power of two")
    values, rows = shingles(found, shingle)
    flat = np.full(found.row_count * permutations, _EMPTY, dtype=U64)
    if len(values):
        bins = (values >> U64(64 - bits)).astype(np.int64) if bits else np.zeros(len(values), int)
        np.minimum.at(flat, rows * permutations + bins, values & U64((1 << (64 - bits)) - 1))
    return _densify(flat.reshape(found.row_count, permutations))


_probe_cache: dict[tuple[int, int], np.ndarray] = {}
DENSE_ATTEMPTS = 2
SPARSE_BINS = 8
_rank_cache: dict[tuple[int, int], np.ndarray] = {}


def _ranks(width: int, attempts: int) -> np.ndarray:
    """(width, width) int64: ``rank[j, i]``, the first attempt at which empty bin ``j`` probes
    bin ``i`` (``attempts`` when it never does)."""
    key = (width, attempts)
    with _cache_lock:
        if key not in _rank_cache:
            source_of = _probes(width, attempts)
            rank = np.full((width, width), attempts, dtype=np.int64)
            columns = np.arange(width)
            for attempt in range(attempts - 1, -1, -1):  # the earliest attempt written last
                rank[columns, source_of[attempt]] = attempt
            _rank_cache[key] = rank
        return _rank_cache[key]


def _probes(width: int, attempts: int) -> np.ndarray:
    """(attempts, width) int64: the bin that empty bin ``j`` is filled from at each attempt."""
    key = (width, attempts)
    with _cache_lock:
        if key not in _probe_cache:
            bins = np.arange(width, dtype=U64)[None, :]
            attempt = np.arange(attempts, dtype=U64)[:, None] << U64(32)
            _probe_cache[key] = (mix64(bins | attempt) % U64(width)).astype(np.int64)
        return _probe_cache[key]


def _densify(signature: np.ndarray, *, attempts: int = 4096) -> np.ndarray:
    """Fill each empty bin ``j`` from the first non-empty bin among ``h(j, 0), h(j, 1), ...``
    (optimal densification, Shrivastava 2017): the probe sequence depends on the bin only, so
    two rows agree on a filled bin exactly when they agree on the bin it was filled from, and
    different empty bins draw from different bins. Filling from the next bin to the right
    (rotation densification) instead made the bins of short rows copies of a few neighbours:
    on the test corpus it missed 0.5% of the planted pairs at the threshold (some at J = 0.87),
    where 32 independent bands of 4 bins should miss 0.02%."""
    empty = signature == _EMPTY
    if not empty.any():
        return signature
    width = signature.shape[1]
    counts = width - empty.sum(axis=1)
    out = signature.copy()
    source_of = _probes(width, attempts)
    # Rows with few full bins take the rank route (below); the others probe bin by bin: the
    # first attempts over the whole matrix (a column gather and a masked copy, cheap per
    # cell), then the few cells still empty one by one.
    need = empty & (counts > SPARSE_BINS)[:, None]
    for attempt in range(min(DENSE_ATTEMPTS, attempts)):
        candidate = signature[:, source_of[attempt]]
        take = need & (candidate != _EMPTY)
        np.copyto(out, candidate, where=take)
        need &= ~take
    cells = np.flatnonzero(need)
    flat_signature, flat_out, mask = signature.reshape(-1), out.reshape(-1), width - 1
    for attempt in range(DENSE_ATTEMPTS, attempts):
        if not len(cells):
            break
        bins = cells & mask
        value = flat_signature[cells - bins + source_of[attempt][bins]]
        found = value != _EMPTY
        flat_out[cells[found]] = value[found]
        cells = cells[~found]
    if len(cells):  # unlucky for ``attempts`` probes
        flat_out[cells] = signature[cells // width].min(axis=1)
    sparse = np.flatnonzero((counts > 0) & (counts <= SPARSE_BINS))
    for start in range(0, len(sparse), 2048):
        rows = sparse[start : start + 2048]
        out[rows] = _densify_sparse(signature[rows], empty[rows], attempts)
    return out


def _densify_sparse(signature: np.ndarray, empty: np.ndarray, attempts: int) -> np.ndarray:
    """The same fills for rows of at most ``SPARSE_BINS`` full bins, without walking the
    probes: empty bin ``j`` takes the full bin ``i`` that its probe sequence reaches first (the
    least ``rank[j, i]``). A row of one shingle (one full bin) needs about 128 probes per empty
    bin and, over many rows, some 1,500 probing rounds: on the data bench's corpus this route
    took the densification of 60,000 rows from 0.73 s to 0.52 s (rows of up to 8 full bins; 16
    was slower again, 0.63 s)."""
    width = signature.shape[1]
    full_first = np.argsort(empty, axis=1, kind="stable")[:, :SPARSE_BINS]  # full bins first
    valid = ~np.take_along_axis(empty, full_first, axis=1)
    rank = _ranks(width, attempts)[:, full_first]  # (bin j, row, candidate)
    rank = np.where(valid[None], rank, attempts + 1)
    best = rank.argmin(axis=2)  # (bin j, row)
    reached = np.take_along_axis(rank, best[..., None], axis=2)[..., 0] < attempts
    source = np.take_along_axis(full_first, best.T, axis=1)  # (row, bin j)
    filled = np.take_along_axis(signature, source, axis=1)
    filled = np.where(reached.T, filled, signature.min(axis=1, keepdims=True))
    return np.where(empty, filled, signature)


def normalised_hashes(column: pa.Array) -> np.ndarray:
    """One 64-bit hash per row of its normalised words in order (see the module's docstring)."""
    return _hash_words(words(column))


@dataclass(frozen=True)
class Duplicates:
    """Which rows to keep and, for each dropped row, the row it duplicates."""

    keep: np.ndarray  # bool per row
    exact_of: np.ndarray  # int64 per row: the kept row with the same text, or -1
    near_of: np.ndarray  # int64 per row: the kept row of its near-duplicate cluster, or -1
    pairs: np.ndarray  # (k, 2) int64: the candidate pairs that passed the threshold
    similarity: np.ndarray  # float per pair: their exact Jaccard similarity
    candidates: int = 0  # pairs the bands proposed


def _chunks(column: pa.Array, limit: int):
    """(first row, slice) runs of consecutive rows holding at most ``limit`` bytes of text (a
    longer row is a run of its own)."""
    offsets, _ = _string_parts(column)
    start = 0
    while start < len(column):
        stop = int(np.searchsorted(offsets, offsets[start] + limit, side="right")) - 1
        stop = min(max(stop, start + 1), len(column))
        yield start, column.slice(start, stop - start)
        start = stop


def find_duplicates(
    column: pa.Array | pa.ChunkedArray,
    *,
    exact: bool = True,
    near: bool = True,
    threshold: float = 0.8,
    permutations: int = 128,
    bands: int | None = None,
    shingle: int = 3,
    chunk_bytes: int = CHUNK_BYTES,
    workers: int | None = None,
) -> Duplicates:
    """Exact duplicates, then near duplicates among the rows left (see the module's docstring)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not 0 < threshold <= 1:
        raise ValueError("threshold must be in (0, 1]")
    if bands is not None and (bands < 1 or permutations % bands):
        raise ValueError("bands must divide permutations")
    total = len(column)
    keep = np.ones(total, dtype=bool)
    exact_of = np.full(total, -1, dtype=np.int64)
    near_of = np.full(total, -1, dtype=np.int64)
    hashes = np.zeros(total, dtype=U64)
    signature = np.zeros((total, permutations), dtype=U64) if near else None

    def hash_run(start: int, part: pa.Array) -> None:
        found = words(part)
        if exact:
            hashes[start : start + len(part)] = _hash_words(found)
        if signature is not None:
            signature[start : start + len(part)] = signatures(
                found, permutations=permutations, shingle=shingle
            )

    # NumPy releases the GIL in its loops: runs hashed on threads use every core (1.8x on 2).
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for done in [pool.submit(hash_run, *run) for run in _chunks(column, chunk_bytes)]:
            done.result()
    if exact:
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        owner = first[inverse]
        dropped = owner != np.arange(total)
        keep[dropped] = False
        exact_of[dropped] = owner[dropped]
    pairs = np.zeros((0, 2), dtype=np.int64)
    similarity = np.zeros(0)
    proposed = 0
    if signature is not None:
        candidates = _candidate_pairs(
            signature, keep, bands=bands or choose_bands(permutations, threshold), workers=workers
        )
        proposed = len(candidates)
        candidates = candidates[
            estimated_similarity(signature, candidates) >= prefilter_cut(threshold, permutations)
        ]
        similarity = jaccard(column, candidates, shingle=shingle, workers=workers)
        passed = similarity >= threshold
        pairs, similarity = candidates[passed], similarity[passed]
        if len(pairs):
            graph = coo_matrix(
                (np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(total, total)
            )
            _, label = connected_components(graph, directed=False)
            first_of = np.full(label.max() + 1, total, dtype=np.int64)
            candidates = np.flatnonzero(keep)
            np.minimum.at(first_of, label[candidates], candidates)
            owner = first_of[label]
            dropped = keep & (owner != np.arange(total))
            keep[dropped] = False
            near_of[dropped] = owner[dropped]
    return Duplicates(keep, exact_of, near_of, pairs, similarity, proposed)


def _hash_words(found: Words) -> np.ndarray:
    # an order-dependent combination: each word's hash mixed with its place in the row
    out = np.zeros(found.row_count, dtype=U64)
    counts = np.bincount(found.rows, minlength=found.row_count)
    if len(found.hashes):
        first = np.searchsorted(found.rows, np.arange(found.row_count))
        place = np.arange(len(found.rows)) - first[found.rows]
        mixed = mix64(found.hashes ^ mix64(place.astype(U64) + U64(1)))
        # words come in row order: a sum per run (add.at, one row at a time, took 3x as long)
        has = counts > 0
        out[has] = np.add.reduceat(mixed, first[has])
    counts = counts.astype(U64)
    return mix64(out ^ mix64(counts + U64(0x51ED27)))


def estimated_similarity(
    signature: np.ndarray, pairs: np.ndarray, *, block: int = 65_536
) -> np.ndarray:
    """The share of equal bins of each pair's signatures (MinHash's estimate of Jaccard)."""
    out = np.zeros(len(pairs))
    for start in range(0, len(pairs), block):
        a, b = pairs[start : start + block, 0], pairs[start : start + block, 1]
        out[start : start + len(a)] = (signature[a] == signature[b]).mean(axis=1)
    return out


def prefilter_cut(threshold: float, permutations: int) -> float:
    """The estimate below which a candidate pair is dropped without the exact check: six
    standard deviations of the estimate (``permutations`` Bernoulli bins at the threshold) and
    0.05 more below the threshold, so a pair at the threshold is lost with probability well
    under 1e-9 even if densified bins are less independent than fresh ones. On the data bench's
    200k-row corpus it sent a third of LSH's candidates (mostly pairs of short rows sharing a
    band by chance) to the exact check, which took 1.45 s of the 5.7 s before."""
    spread = (threshold * (1 - threshold) / permutations) ** 0.5
    return threshold - 6 * spread - 0.05


def choose_bands(permutations: int, threshold: float, *, recall: float = 0.999) -> int:
    """The fewest bands (the most bins per band, so the fewest false candidates) with which a
    pair at the threshold becomes a candidate with probability at least ``recall``."""
    for rows in range(permutations, 0, -1):
        if permutations % rows:
            continue
        bands = permutations // rows
        if 1 - (1 - threshold**rows) ** bands >= recall:
            return bands
    return permutations


# Odd multipliers that combine a band's bins into one key before one mix (a key collision only
# adds a candidate, which the exact check then drops).
_BAND_MULTIPLIERS = [U64(m) for m in mix64(np.arange(1, 17, dtype=U64)) | U64(1)]


def _candidate_pairs(
    signature: np.ndarray, candidates: np.ndarray, *, bands: int, workers: int | None = None
) -> np.ndarray:
    """Pairs (the first row of a band bucket, another row in it) among the candidate rows with
    words, each pair once."""
    rows = np.flatnonzero(candidates & (signature[:, 0] != _EMPTY))
    if len(rows) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    # A band's bins are ``bands`` apart (any fixed choice would do: densified bins are filled
    # from hashed positions, not from their neighbours), so bin ``c * bands + b`` is the c-th
    # of band b: every band's key at once, a (rows, bands) pass per bin of a band.
    width = signature.shape[1] // bands
    grouped = signature.reshape(len(signature), width, bands)
    keys = grouped[:, 0, :] * _BAND_MULTIPLIERS[0]
    for column in range(1, width):
        keys += grouped[:, column, :] * _BAND_MULTIPLIERS[column % len(_BAND_MULTIPLIERS)]
    keys = np.ascontiguousarray(mix64(keys[rows]).T)

    def band_pairs(key: np.ndarray) -> np.ndarray:
        order = np.argsort(key)
        ordered = key[order]
        starts = np.concatenate(([True], ordered[1:] != ordered[:-1]))
        group_first = order[np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]
        member = ~starts
        return np.stack([group_first[member], order[member]], axis=1)

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        found = [p for p in pool.map(band_pairs, keys) if len(p)]
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    # one 64-bit key per pair: a 1-D unique sorts 8 times faster than the (k, 2) one
    both = np.concatenate(found).astype(np.int64)
    key = np.unique((both[:, 0] << 32) | both[:, 1])
    return rows[np.stack([key >> 32, key & 0xFFFFFFFF], axis=1)]


_SET_BITS = 40  # shingle hashes are compared on 40 bits: a false match in a pair of rows of
# 1,000 shingles each has probability about 1e-6, and a key (row or pair << 40 | hash) sorts as
# one uint64 instead of two columns
_SET_MASK = U64((1 << _SET_BITS) - 1)


def _shingle_sets(
    column: pa.Array, rows: np.ndarray, shingle: int, workers: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, values): each listed row's distinct shingle hashes (40 bits), sorted, as CSR.
    Runs of rows are hashed and sorted on threads; keyed by (row, hash), the sorted runs
    concatenate in order."""
    picked = column.take(pa.array(rows))

    def run_keys(start: int, part: pa.Array) -> np.ndarray:
        values, owner = shingles(words(part), shingle)
        return np.sort(((owner + start).astype(U64) << U64(_SET_BITS)) | (values & _SET_MASK))

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        keys = list(pool.map(lambda run: run_keys(*run), _chunks(picked, CHUNK_BYTES)))
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=U64)
    key = key[np.concatenate(([True], key[1:] != key[:-1]))] if len(key) else key
    owner = (key >> U64(_SET_BITS)).astype(np.int64)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(rows)), out=indptr[1:])
    return indptr, key & _SET_MASK


def _ranges(indptr: np.ndarray, which: np.ndarray) -> np.ndarray:
    """The concatenated positions ``indptr[w] .. indptr[w + 1]`` for each ``w`` in order."""
    lengths = indptr[which + 1] - indptr[which]
    before = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.repeat(indptr[which] - before, lengths) + np.arange(lengths.sum())


def jaccard(
    column: pa.Array,
    pairs: np.ndarray,
    *,
    shingle: int,
    block: int = 100_000,
    workers: int | None = None,
) -> np.ndarray:
    """The exact Jaccard similarity of each pair's shingle sets (0 when both are empty). Each
    row's set is built once (a row is in many pairs; built per block of pairs instead, the
    rows of two blocks were hashed twice), then blocks of pairs are intersected on threads."""
    out = np.zeros(len(pairs))
    if not len(pairs):
        return out
    rows, local = np.unique(pairs, return_inverse=True)
    local = local.reshape(pairs.shape)
    indptr, values = _shingle_sets(column, rows, shingle, workers)
    threads = workers or os.cpu_count() or 1
    size = max(1, min(block, -(-len(pairs) // threads)))

    def one_block(start: int) -> None:
        out[start : start + size] = _jaccard_block(indptr, values, local[start : start + size])

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for done in [pool.submit(one_block, s) for s in range(0, len(pairs), size)]:
            done.result()
    return out


def _jaccard_block(indptr: np.ndarray, values: np.ndarray, part: np.ndarray) -> np.ndarray:
    """The Jaccard similarity of pairs of rows of the CSR sets (``part`` holds set numbers)."""
    sizes = indptr[1:] - indptr[:-1]
    a, b = part[:, 0], part[:, 1]
    number = np.arange(len(part), dtype=U64) << U64(_SET_BITS)
    # Keyed by (pair, shingle), each side is sorted already (pairs in order, each set sorted):
    # a binary search of one side in the other finds the shared shingles (half the time of
    # sorting the two sides together on the data bench's corpus, 0.31 s against 0.56 s).
    first = np.repeat(number, sizes[a]) | values[_ranges(indptr, a)]
    second = np.repeat(number, sizes[b]) | values[_ranges(indptr, b)]
    shared = np.zeros(len(part), dtype=np.int64)
    if len(first) and len(second):
        at = np.minimum(np.searchsorted(second, first), len(second) - 1)
        found = first[second[at] == first]
        shared = np.bincount((found >> U64(_SET_BITS)).astype(np.int64), minlength=len(part))
    union = sizes[a] + sizes[b] - shared
    return np.divide(shared, union, out=np.zeros(len(part)), where=union > 0)
