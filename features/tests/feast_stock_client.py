"""Run in the Feast peer's virtualenv (never the platform's): stock Feast against the platform.

    python feast_stock_client.py apply REPO_DIR
    python feast_stock_client.py read CLIENT_DIR PROJECT REGISTRY URL FEATURES_JSON ROWS_JSON

``apply`` registers the definitions of the features bench's ``repo.py`` in REPO_DIR's registry
(its feature_store.yaml names a local SQLite online store, which nothing reads). ``read`` writes a
client feature_store.yaml in CLIENT_DIR whose online store is Feast's ``remote`` store at URL,
authenticated with the platform token in ``RANKOPS_TOKEN`` as a bearer token, and prints Feast's
``get_online_features(...).to_dict()`` as one JSON line.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

CLIENT_CONFIG = """project: {project}
provider: local
registry:
  path: {registry}
  cache_ttl_seconds: 0
online_store:
  type: remote
  path: {url}
auth:
  type: oidc
  token_env_var: RANKOPS_TOKEN
entity_key_serialization_version: 3
"""


def apply(repo: Path) -> dict:
    from feast import FeatureStore

    spec = importlib.util.spec_from_file_location("feast_repo_definitions", repo / "repo.py")
    definitions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(definitions)
    store = FeatureStore(repo_path=str(repo))
    store.apply([*definitions.entities, *definitions.sources, *definitions.views])
    return {"views": sorted(view.name for view in definitions.views), "project": store.project}


def read(client: Path, project: str, registry: str, url: str, features: list, rows: list) -> dict:
    from feast import FeatureStore

    client.mkdir(parents=True, exist_ok=True)
    (client / "feature_store.yaml").write_text(
        CLIENT_CONFIG.format(project=project, registry=registry, url=url)
    )
    store = FeatureStore(repo_path=str(client))
    return store.get_online_features(features=features, entity_rows=rows).to_dict()


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "apply":
        print(json.dumps(apply(Path(argv[2]))))
        return 0
    if len(argv) == 8 and argv[1] == "read":
        client, project, registry, url = Path(argv[2]), argv[3], argv[4], argv[5]
        result = read(client, project, registry, url, json.loads(argv[6]), json.loads(argv[7]))
        print(json.dumps(result))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
