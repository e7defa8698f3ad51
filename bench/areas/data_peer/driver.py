"""The datasketch peer of the data bench, run in ``bench/.venvs/datasketch`` (see ``data.py``).

Reads ``{"texts": <parquet>, "threshold", "permutations", "shingle"}`` as argv[1], and prints one
JSON line: the seconds of the dedup (tokenise, ``MinHash.bulk``, ``MinHashLSH`` insertion and one
query per row) and the pairs (a, b), a < b, that LSH proposed above the threshold by the MinHash
estimate, which is how datasketch's users deduplicate.
"""

import json
import re
import sys
import time

import pyarrow.parquet as pq
from datasketch import MinHash, MinHashLSH

WORD = re.compile(r"[a-z0-9\x80-\U0010ffff]+")


def shingles(text, size):
    words = WORD.findall((text or "").lower())
    if 0 < len(words) < size:
        return [" ".join(words).encode()]
    return [" ".join(words[i : i + size]).encode() for i in range(len(words) - size + 1)]


def main():
    spec = json.loads(sys.argv[1])
    texts = pq.read_table(spec["texts"]).column("text").to_pylist()
    threshold, permutations, size = spec["threshold"], spec["permutations"], spec["shingle"]
    started = time.perf_counter()
    sets = [shingles(t, size) or [b""] for t in texts]
    hashes = MinHash.bulk(sets, num_perm=permutations)
    lsh = MinHashLSH(threshold=threshold, num_perm=permutations)
    with lsh.insertion_session() as session:
        for key, minhash in enumerate(hashes):
            session.insert(key, minhash, check_duplication=False)
    pairs = set()
    for key, minhash in enumerate(hashes):
        for other in lsh.query(minhash):
            if other != key and minhash.jaccard(hashes[other]) >= threshold:
                pairs.add((min(key, other), max(key, other)))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "pairs": sorted(pairs)}))


if __name__ == "__main__":
    main()
