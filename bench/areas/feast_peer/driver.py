"""Run in the Feast peer's virtualenv: register the bench repo and materialise it into Redis.

    python driver.py setup REPO_DIR START_ISO END_ISO

Applies repo.py's entities, sources and feature views to the repo's registry, materialises the
views for [START, END] into the online store and prints one JSON line with the timings (the bench
reads the last line starting with "{"). The bench removes the online rows itself afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from datetime import datetime
from pathlib import Path


def _repo_module(repo: Path):
    spec = importlib.util.spec_from_file_location("bench_feast_repo", repo / "repo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup(repo: Path, start: datetime, end: datetime) -> dict:
    from feast import FeatureStore

    definitions = _repo_module(repo)
    store = FeatureStore(repo_path=str(repo))
    started = time.perf_counter()
    store.apply([*definitions.entities, *definitions.sources, *definitions.views])
    applied = time.perf_counter()
    names = [view.name for view in definitions.views]
    store.materialize(start_date=start, end_date=end, feature_views=names)
    done = time.perf_counter()
    return {
        "apply_s": round(applied - started, 3),
        "materialize_s": round(done - applied, 3),
        "feature_views": {view.name: len(view.features) for view in definitions.views},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[1] != "setup":
        print(__doc__, file=sys.stderr)
        return 2
    result = setup(Path(argv[2]), datetime.fromisoformat(argv[3]), datetime.fromisoformat(argv[4]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
