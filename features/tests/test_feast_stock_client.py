"""Stock Feast against the platform: the features bench's Feast repository (its ``repo.py``,
rendered by ``bench.areas.features.render_feast_repo``) is applied with Feast, dumped with the
stock ``feast registry-dump``, imported, and read back by Feast's own ``remote`` online store from
the platform's Feast endpoint over HTTP; the values are those ``online-features/`` answers.

Feast runs in the peer's virtualenv (``bench/.venvs/feast``, built by ``.ci/run`` before the suite
and on first use here), never in the platform's.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.areas.features import (
    FEAST_PROJECT,
    FEAST_TIMESTAMP,
    FeastView,
    FeatureTable,
    feast_python,
    render_feast_repo,
    write_feast_parquet,
)
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for

SCRIPT = Path(__file__).with_name("feast_stock_client.py")
STORE_YAML = """project: {project}
provider: local
registry:
  path: {repo}/data/registry.db
  cache_ttl_seconds: 0
online_store:
  type: sqlite
  path: {repo}/data/online.db
offline_store:
  type: file
entity_key_serialization_version: 3
"""
STAMP = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp())


def table(entity: str, count: int, specs: list[dict[str, str]]) -> FeatureTable:
    """``count`` entities (ids 1..count) with values that differ per entity and feature."""
    rows = []
    for entity_id in range(1, count + 1):
        row = {entity: entity_id, "event_time": STAMP + entity_id}
        for index, spec in enumerate(specs):
            raw = (entity_id * 7919 + index * 104729) % 1000
            row[spec["name"]] = raw / 64 if spec["dtype"] == "float" else raw
        rows.append(row)
    return FeatureTable(specs=specs, rows=rows, entity=entity)


USERS = table(
    "user_id",
    25,
    [
        {"name": "age", "dtype": "int"},
        {"name": "rating_mean", "dtype": "float"},
        {"name": "clicks", "dtype": "int"},
    ],
)
ITEMS = table(
    "item_id", 12, [{"name": "price", "dtype": "float"}, {"name": "year", "dtype": "int"}]
)


def feast_env(token: str = "") -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "PYTHON", "DATABASE_", "REDIS_")) and k != "VIRTUAL_ENV"
    }
    env.update(FEAST_USAGE="False", RANKOPS_TOKEN=token, NO_PROXY="127.0.0.1,localhost")
    return env


def run(python: Path, *args: str, token: str = "", check: bool = True):
    done = subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=240, env=feast_env(token)
    )
    if check:
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


@pytest.fixture(scope="module")
def feast() -> Path:
    return feast_python()


@pytest.fixture
def feast_repo(feast, tmp_path) -> dict:
    """The bench's Feast repository for USERS and ITEMS, applied, and its registry-dump."""
    repo = tmp_path / "feast_repo"
    views = [
        FeastView("user_features", USERS, repo / "data" / "users.parquet"),
        FeastView("item_features", ITEMS, repo / "data" / "items.parquet"),
    ]
    for view in views:
        write_feast_parquet(view.table, view.parquet_path)
    render_feast_repo(repo, views=views, redis_connection="unused:6379")
    (repo / "feature_store.yaml").write_text(STORE_YAML.format(project=FEAST_PROJECT, repo=repo))
    applied = json.loads(run(feast, str(SCRIPT), "apply", str(repo)).stdout.splitlines()[-1])
    assert applied["views"] == ["item_features", "user_features"]
    dumped = run(feast.parent / "feast", "-c", str(repo), "registry-dump")
    return {"repo": repo, "dump": json.loads(dumped.stdout)}


def push_rows(client, workspace, group: str, source: FeatureTable) -> None:
    rows = [
        {
            **{k: v for k, v in row.items() if k != "event_time"},
            FEAST_TIMESTAMP: datetime.fromtimestamp(row["event_time"], tz=UTC).isoformat(),
        }
        for row in source.rows
    ]
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/feature-groups/{group}/batches/",
        {"rows": rows},
        format="json",
    )
    assert response.status_code == 201, response.content


def feast_read(feast, tmp_path, repo, url, token, features, rows, *, check=True):
    return run(
        feast,
        str(SCRIPT),
        "read",
        str(tmp_path / "client"),
        FEAST_PROJECT,
        str(repo / "data" / "registry.db"),
        url,
        json.dumps(features),
        json.dumps(rows),
        token=token,
        check=check,
    )


@pytest.mark.django_db(transaction=True)
def test_a_feast_repository_imports_and_feast_reads_what_online_features_answers(
    feast, feast_repo, live_server, tmp_path, client_for
):
    workspace = make_workspace()
    developer = make_member(workspace, Role.DEVELOPER)
    client = client_for(developer)
    imported = client.post(
        f"/api/v1/workspaces/{workspace.slug}/feast/import/",
        {"registry": feast_repo["dump"]},
        format="json",
    )
    assert imported.status_code == 201, imported.content
    outcomes = {g["name"]: g for g in imported.json()["feature_groups"]}
    assert outcomes["user_features"]["outcome"] == "created"
    assert outcomes["user_features"]["entity"] == "user"
    assert outcomes["user_features"]["entity_keys"] == ["user_id"]
    assert outcomes["user_features"]["event_time_column"] == FEAST_TIMESTAMP
    assert outcomes["item_features"]["entity"] == "item"
    push_rows(client, workspace, "user_features", USERS)
    push_rows(client, workspace, "item_features", ITEMS)

    reader = make_member(workspace, Role.VIEWER)
    token = token_for(reader, workspaces=[workspace])
    url = f"{live_server.url}/api/v1/workspaces/{workspace.slug}/feast"
    for view, source, ids in (
        ("user_features", USERS, [3, 1, 25, 999]),
        ("item_features", ITEMS, [12, 2, 500]),
    ):
        refs = [f"{view}:{spec['name']}" for spec in source.specs]
        done = feast_read(
            feast,
            tmp_path,
            feast_repo["repo"],
            url,
            token,
            refs,
            [{source.entity: i} for i in ids],
        )
        got = json.loads(done.stdout.splitlines()[-1])
        ours = client.post(
            f"/api/v1/workspaces/{workspace.slug}/online-features/",
            {"entities": ids, "features": refs},
            format="json",
        ).json()["rows"]
        names = [spec["name"] for spec in source.specs]
        assert got[source.entity] == ids
        assert [[got[name][i] for name in names] for i in range(len(ids))] == ours
        # values the platform stored, not nulls on both sides: the last id is unknown
        assert ours[-1] == [None] * len(names) and None not in ours[0]

    # a token of another workspace reads nothing, through Feast as through the API
    rival = make_workspace()
    stranger = token_for(make_member(rival, Role.ADMIN), workspaces=[rival])
    refused = feast_read(
        feast,
        tmp_path,
        feast_repo["repo"],
        url,
        stranger,
        ["user_features:age"],
        [{"user_id": 1}],
        check=False,
    )
    assert refused.returncode != 0
    assert "404" in refused.stdout + refused.stderr
