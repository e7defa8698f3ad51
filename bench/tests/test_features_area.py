"""Tests of the features bench's pure helpers; neither Feast nor the benchmark itself runs here."""

from __future__ import annotations

import http.server
import io
import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from bench import harness
from bench.areas import features as area
from bench.harness import BenchError
from features.ingestion import table_from_parquet, table_from_rows
from features.lookup import REF_PATTERN
from features.models import FeatureGroup, FeatureGroupVersion
from features.registry import normalise_features

GENRES = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
DAY = 86400


def _flags(*on: int) -> str:
    return "|".join("1" if i in on else "0" for i in range(19))


@pytest.fixture
def movielens(tmp_path: Path) -> Path:
    """A MovieLens-shaped folder: 3 users, 3 items, 6 ratings (user 3 rated nothing)."""
    folder = tmp_path / "ml"
    folder.mkdir()
    (folder / "u.user").write_text(
        "1|24|M|technician|85711\n2|53|F|other|94043\n3|23|M|writer|32067\n"
    )
    (folder / "u.occupation").write_text("other\ntechnician\nwriter\n")
    (folder / "u.genre").write_text("".join(f"{g}|{i}\n" for i, g in enumerate(GENRES)) + "\n")
    items = [
        f"1|Toy Story (1995)|01-Jan-1995||http://x|{_flags(3, 4, 5)}",
        f"2|GoldenEye (1995)|01-Jan-1995||http://x|{_flags(1, 2, 16)}",
        # Latin-1 in a title, and no release date.
        f"3|Caf\xe9 (1996)|||http://x|{_flags(8)}",
    ]
    (folder / "u.item").write_bytes(("\n".join(items) + "\n").encode("latin-1"))
    ratings = [
        (1, 1, 5, 1000 * DAY),
        (1, 2, 3, 1002 * DAY),
        (1, 3, 4, 1010 * DAY),
        (2, 1, 1, 1001 * DAY),
        (2, 2, 2, 1005 * DAY),
        (2, 1, 5, 1020 * DAY),
    ]
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ratings))
    return folder


# --- the feature table --------------------------------------------------------------------------


def assert_50_valid_features(table, group: str, entity: str) -> None:
    """Exactly 50 distinct, registrable features, and every row holds each with its dtype."""
    assert len(table.specs) == 50
    assert len(set(table.names)) == 50
    assert all(REF_PATTERN.match(f"{group}:{name}") for name in table.names)
    # The platform's registry accepts the specs as they are.
    assert len(normalise_features([dict(s) for s in table.specs])) == 50
    for row in table.rows:
        assert set(row) == {entity, area.EVENT_TIME, *table.names}
        for spec in table.specs:
            value = row[spec["name"]]
            assert isinstance(value, int if spec["dtype"] == "int" else float), spec


def test_build_user_features_has_exactly_50_valid_features(movielens):
    table = area.build_user_features(movielens)

    assert_50_valid_features(table, area.USER_GROUP, area.ENTITY)
    assert {spec["dtype"] for spec in table.specs} == {"int", "float"}
    assert [row[area.ENTITY] for row in table.rows] == [1, 2, 3]


def test_build_user_features_computes_the_real_features(movielens):
    rows = area.build_user_features(movielens).by_id()
    one, two, three = rows[1], rows[2], rows[3]

    assert (one["age"], one["gender_male"], one["occupation_idx"]) == (24, 1, 1)
    assert (two["gender_male"], two["occupation_idx"]) == (0, 0)
    assert one["rating_count"] == 3
    assert one["rating_mean"] == pytest.approx(4.0)
    assert one["rating_share_5"] == pytest.approx(1 / 3, abs=1e-6)
    assert one["positive_rate"] == pytest.approx(2 / 3, abs=1e-6)
    assert one[area.EVENT_TIME] == 1010 * DAY
    assert one["active_days"] == pytest.approx(10.0)
    # The dataset ends with user 2's last rating.
    assert one["days_since_last_rating"] == pytest.approx(10.0)
    assert two["days_since_last_rating"] == 0.0
    # Genre shares of the rated items: items 1 (animation, children's, comedy), 2, 3 (drama).
    assert one["genre_childrens"] == pytest.approx(1 / 3, abs=1e-6)
    assert one["genre_sci_fi"] == 0.0
    assert one["genre_drama"] == pytest.approx(1 / 3, abs=1e-6)
    assert two["genre_animation"] == pytest.approx(2 / 3, abs=1e-6)
    # Item 3 has no release year: only items 1 and 2 count.
    assert one["release_year_mean"] == pytest.approx(1995.0)
    # Item 1 was rated three times, item 2 twice, item 3 once.
    assert one["item_popularity_mean"] == pytest.approx(2.0)
    # A user without ratings gets zeros, not an error.
    assert three["rating_count"] == 0
    assert three["rating_mean"] == 0.0


def test_build_item_features_has_exactly_50_valid_features(movielens):
    table = area.build_item_features(movielens)

    assert table.entity == area.ITEM_ENTITY
    assert_50_valid_features(table, area.ITEM_GROUP, area.ITEM_ENTITY)
    assert sorted(table.by_id()) == [1, 2, 3]


def test_build_item_features_computes_the_real_features(movielens):
    rows = area.build_item_features(movielens).by_id()
    toy, golden, cafe = rows[1], rows[2], rows[3]

    assert toy["release_year"] == 1995 and cafe["release_year"] == 0  # no release date
    assert (toy["is_animation"], toy["is_childrens"], toy["is_drama"]) == (1, 1, 0)
    assert cafe["is_drama"] == 1
    # Item 1: ratings 5 (user 1), 1 and 5 (user 2); its last one on day 1020.
    assert toy["rating_count"] == 3
    assert toy["rating_mean"] == pytest.approx(11 / 3, abs=1e-6)
    assert toy["rating_share_5"] == pytest.approx(2 / 3, abs=1e-6)
    assert toy[area.EVENT_TIME] == 1020 * DAY
    assert toy["active_days"] == pytest.approx(20.0)
    assert toy["days_since_last_rating"] == 0.0
    assert golden["days_since_last_rating"] == pytest.approx(15.0)
    # Raters: users 1 (24, M), 2 (53, F), 2 again.
    assert toy["rater_age_mean"] == pytest.approx((24 + 53 + 53) / 3, abs=1e-6)
    assert toy["rater_male_share"] == pytest.approx(1 / 3, abs=1e-6)
    assert cafe["rater_male_share"] == 1.0
    # Generated features differ from the users' for the same id.
    users = area.build_user_features(movielens).by_id()
    assert toy["gen_01"] != users[1].get("gen_01")


def test_lookup_bodies_take_users_and_items_in_turn():
    users = area.FeatureTable(specs=[{"name": "age", "dtype": "int"}], rows=[])
    items = area.FeatureTable(
        specs=[{"name": "rating_mean", "dtype": "float"}], rows=[], entity=area.ITEM_ENTITY
    )
    sources = [
        area.Source(users, area.USER_GROUP, "user_features"),
        area.Source(items, area.ITEM_GROUP, "item_features"),
    ]
    schedules = [[[1], [2], [3]], [[10], [20], [30]]]

    ours = [json.loads(b) for b in area.lookup_bodies(sources, schedules, peer=False)]
    feast = [json.loads(b) for b in area.lookup_bodies(sources, schedules, peer=True)]

    assert ours == [
        {"entities": [1], "features": [f"{area.USER_GROUP}:age"]},
        {"entities": [20], "features": [f"{area.ITEM_GROUP}:rating_mean"]},
        {"entities": [3], "features": [f"{area.USER_GROUP}:age"]},
    ]
    assert feast[1] == {"features": ["item_features:rating_mean"], "entities": {"item_id": [20]}}
    assert feast[2] == {"features": ["user_features:age"], "entities": {"user_id": [3]}}


def test_generated_features_are_deterministic(movielens):
    first = area.build_user_features(movielens)
    again = area.build_user_features(movielens)

    assert first == again
    generated = [s for s in first.specs if s["name"].startswith("gen_")]
    assert generated
    assert {s["dtype"] for s in generated} == {"int", "float"}
    values = {row[generated[0]["name"]] for row in first.rows}
    assert len(values) > 1  # they differ between users


def test_feature_count_is_respected(movielens):
    assert len(area.build_user_features(movielens, feature_count=60).specs) == 60
    assert area.build_user_features(movielens, feature_count=5).names == [
        "age",
        "gender_male",
        "occupation_idx",
        "rating_count",
        "rating_mean",
    ]


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Children's", "childrens"),
        ("Sci-Fi", "sci_fi"),
        ("Film-Noir", "film_noir"),
        ("?", "unnamed"),
    ],
)
def test_snake_name(text, name):
    assert area.snake_name(text) == name


def test_json_rows_pass_the_platforms_validation(movielens):
    table = area.build_user_features(movielens)
    group, version = _group(table.specs)

    arrow = table_from_rows(
        area.json_rows(table), group=group, version=version, now=datetime.now(UTC)
    )

    assert arrow.num_rows == 3
    assert arrow[area.EVENT_TIME][0].as_py() == datetime.fromtimestamp(1010 * DAY, tz=UTC)


def test_feast_parquet_has_the_features_typed(movielens, tmp_path):
    table = area.build_user_features(movielens)
    path = tmp_path / "feast" / "users.parquet"

    area.write_feast_parquet(table, path)

    written = pq.read_table(path)
    assert written.column_names == [area.ENTITY, area.FEAST_TIMESTAMP, *table.names]
    assert written.schema.field(area.ENTITY).type == pa.int64()
    assert written.schema.field(area.FEAST_TIMESTAMP).type == pa.timestamp("us", tz="UTC")
    assert written.schema.field("age").type == pa.int64()
    assert written.schema.field("rating_mean").type == pa.float64()
    assert written.to_pylist()[0]["rating_mean"] == table.rows[0]["rating_mean"]


# --- requests and answers -----------------------------------------------------------------------


def test_lookup_schedule_is_reproducible_and_distinct():
    ids = list(range(1, 944))
    first = area.lookup_schedule(ids, requests=20, per_request=100)

    assert first == area.lookup_schedule(ids, requests=20, per_request=100)
    assert first != area.lookup_schedule(ids, requests=20, per_request=100, seed=1)
    assert all(len(set(entities)) == 100 for entities in first)
    assert all(set(entities) <= set(ids) for entities in first)
    with pytest.raises(ValueError, match="only 3 ids"):
        area.lookup_schedule([1, 2, 3], requests=1, per_request=4)


def test_lookup_bodies():
    ours = json.loads(area.ours_lookup_body([5, 7], "ml_user", ["age", "rating_mean"]))
    feast = json.loads(area.feast_lookup_body([5, 7], "user_features", ["age", "rating_mean"]))

    assert ours == {"entities": [5, 7], "features": ["ml_user:age", "ml_user:rating_mean"]}
    assert feast == {
        "features": ["user_features:age", "user_features:rating_mean"],
        "entities": {"user_id": [5, 7]},
    }


def test_parse_answers_of_both_servers():
    names = ["age", "rating_mean"]
    ours = {"features": ["ml_user:age", "ml_user:rating_mean"], "rows": [[24, 3.5], [53, None]]}
    feast = {
        "metadata": {"feature_names": ["user_id", "age", "rating_mean"]},
        "results": [
            {"values": [1, 2], "statuses": ["PRESENT", "PRESENT"]},
            {"values": [24, 53], "statuses": ["PRESENT", "PRESENT"]},
            {"values": [3.5, None], "statuses": ["PRESENT", "NOT_FOUND"]},
        ],
    }

    expected = {1: {"age": 24, "rating_mean": 3.5}, 2: {"age": 53, "rating_mean": None}}
    assert area.parse_ours(ours, [1, 2], names) == expected
    assert area.parse_feast(feast, [1, 2], names) == expected
    with pytest.raises(BenchError, match="unexpected lookup answer"):
        area.parse_ours(ours, [1], names)
    with pytest.raises(BenchError, match="without"):
        area.parse_feast(feast, [1, 2], ["age", "missing"])


def test_mismatches_compare_within_tolerance():
    expected = {1: {"a": 1, "b": 0.1, "c": None}}

    assert area.mismatches(expected, {1: {"a": 1, "b": 0.1 + 1e-15, "c": None}}) == []
    assert area.mismatches(expected, {1: {"a": 1.0, "b": 0.1, "c": None}}) == []
    assert area.mismatches(expected, {1: {"a": 2, "b": 0.1, "c": 0}}) == [
        "1.a: 1 != 2",
        "1.c: None != 0",
    ]
    assert area.mismatches(expected, {}) == ["1.a: 1 != None", "1.b: 0.1 != None"]
    assert not area.same_value(True, 1)


def test_latency_summary():
    summary = area.latency_summary([float(v) for v in range(1, 101)])

    assert summary == {"p50": 50.5, "p90": 90.1, "p99": 99.01, "max": 100.0}


def test_goal_verdicts():
    verdicts = area.goal_verdicts(
        {
            "online_1x50_p99_ms": 3.0,
            "online_1x50_p99_ms_feast": 6.0,
            "online_100x50_p99_ms": 20.0,
            "online_100x50_p99_ms_feast": 90.0,
            "ingest_json_rows_per_s": 50_000,
            "ingest_parquet_rows_per_s": 150_000,
        }
    )

    assert verdicts == {
        "online_1x50_p99_at_most_third_of_feast": False,
        "online_100x50_p99_at_most_third_of_feast": True,
        "online_100x50_p99_at_most_25_ms": True,
        "ingest_json_at_least_50k_rows_per_s": True,
        "ingest_parquet_at_least_200k_rows_per_s": False,
    }
    unmeasured = area.goal_verdicts({"online_1x50_p99_ms": 3.0, "online_1x50_p99_ms_feast": None})
    assert unmeasured["online_1x50_p99_at_most_third_of_feast"] is None
    assert set(unmeasured) == set(area.GOALS)


# --- generated ingestion batches ----------------------------------------------------------------


def _group(specs):
    group = FeatureGroup(name="bench", entity_keys=[area.ENTITY], event_time_column=area.EVENT_TIME)
    version = FeatureGroupVersion(version=1, features=normalise_features([dict(s) for s in specs]))
    return group, version


def test_ingest_batches_pass_the_platforms_validation():
    now = datetime.now(UTC)
    columns = area.ingest_columns(100, 50, now=now)
    group, version = _group(area.INGEST_SPECS)

    assert columns[area.ENTITY] == list(range(100, 150))
    assert columns == area.ingest_columns(100, 50, now=now)
    document = json.loads(area.ingest_json_body(columns))
    assert len(document["rows"]) == 50
    assert document["rows"][0][area.EVENT_TIME].endswith("Z")
    from_json = table_from_rows(document["rows"], group=group, version=version, now=now)
    from_parquet = table_from_parquet(
        area.ingest_parquet_body(columns), group=group, version=version, now=now
    )

    assert from_json.num_rows == from_parquet.num_rows == 50
    assert from_json.column_names == from_parquet.column_names
    assert from_json["country"].to_pylist() == from_parquet["country"].to_pylist()
    assert from_json["ctr_1d"].to_pylist() == from_parquet["ctr_1d"].to_pylist()


def test_ingest_parquet_body_types():
    body = area.ingest_parquet_body(area.ingest_columns(0, 10, now=datetime.now(UTC)))
    schema = pq.read_table(io.BytesIO(body)).schema

    assert schema.field(area.EVENT_TIME).type == pa.timestamp("us", tz="UTC")
    assert schema.field("clicks_1d").type == pa.int64()
    assert schema.field("score").type == pa.float64()
    assert schema.field("device").type == pa.string()
    assert len(schema) == 2 + len(area.INGEST_SPECS) == 12


# --- the Feast peer -----------------------------------------------------------------------------


def test_render_feast_repo(tmp_path):
    specs = [{"name": "age", "dtype": "int"}, {"name": "rating_mean", "dtype": "float"}]
    users = area.FeatureTable(specs=specs, rows=[])
    items = area.FeatureTable(specs=specs[1:], rows=[], entity=area.ITEM_ENTITY)
    data = tmp_path / "repo" / "data"

    repo = area.render_feast_repo(
        tmp_path / "repo",
        views=[
            area.FeastView("user_features", users, data / "users.parquet"),
            area.FeastView("item_features", items, data / "items.parquet"),
        ],
        redis_connection="127.0.0.1:6379,db=12",
        project="rankops_bench_1",
    )

    config = yaml.safe_load((repo / "feature_store.yaml").read_text())
    assert config == {
        "project": "rankops_bench_1",
        "provider": "local",
        "registry": {"path": str(repo / "data" / "registry.db"), "cache_ttl_seconds": 0},
        "online_store": {"type": "redis", "connection_string": "127.0.0.1:6379,db=12"},
        "offline_store": {"type": "file"},
        "entity_key_serialization_version": 3,
    }
    spec = json.loads((repo / "bench_spec.json").read_text())
    assert spec == {
        "views": [
            {
                "entity": "user_id",
                "view": "user_features",
                "parquet_path": str(data / "users.parquet"),
                "timestamp_field": "event_timestamp",
                "features": specs,
            },
            {
                "entity": "item_id",
                "view": "item_features",
                "parquet_path": str(data / "items.parquet"),
                "timestamp_field": "event_timestamp",
                "features": specs[1:],
            },
        ]
    }
    assert (repo / "repo.py").read_text() == (area.PEER_DIR / "repo.py").read_text()
    assert (repo / "data").is_dir()


def test_peer_scripts_compile():
    for name in ("repo.py", "driver.py"):
        source = (area.PEER_DIR / name).read_text()
        compile(source, name, "exec")
    assert "bench_spec.json" in (area.PEER_DIR / "repo.py").read_text()


def test_feast_requirements_are_pinned():
    assert all("==" in requirement for requirement in area.FEAST_REQUIREMENTS)
    assert area.FEAST_REQUIREMENTS[0] == f"feast[redis]=={area.FEAST_VERSION}"


@pytest.mark.parametrize(
    ("url", "db"),
    [
        ("redis://127.0.0.1:6379/0", 0),
        ("redis://127.0.0.1:6379/3", 3),
        ("redis://127.0.0.1:6379", 0),
        ("redis://127.0.0.1:6379?db=5", 5),
    ],
)
def test_redis_db_of(url, db):
    assert area.redis_db_of(url) == db


def test_feast_redis_db_never_takes_redis_urls_own(monkeypatch):
    monkeypatch.delenv("BENCH_FEAST_REDIS_DB", raising=False)
    assert area.feast_redis_db("redis://127.0.0.1:6379/0") == 12
    assert area.feast_redis_db("redis://127.0.0.1:6379/12") == 11
    monkeypatch.setenv("BENCH_FEAST_REDIS_DB", "7")
    assert area.feast_redis_db("redis://127.0.0.1:6379/0") == 7
    with pytest.raises(BenchError, match="REDIS_URL's own"):
        area.feast_redis_db("redis://127.0.0.1:6379/7")


def test_feast_connection_string():
    assert area.feast_connection_string("redis://127.0.0.1:6379/0", 12) == "127.0.0.1:6379,db=12"
    assert (
        area.feast_connection_string("redis://:s3cret@redis.local:6380/0", 4)
        == "redis.local:6380,db=4,password=s3cret"
    )
    with pytest.raises(BenchError, match="redis:// URLs only"):
        area.feast_connection_string("rediss://127.0.0.1:6379/0", 4)


def test_redis_client_uses_the_asked_database():
    client = area._redis_client("redis://127.0.0.1:6379/0?db=0&socket_timeout=3", 12)
    kwargs = client.connection_pool.connection_kwargs

    assert kwargs["db"] == 12
    assert kwargs["socket_timeout"] == 3.0


# --- the HTTP client ----------------------------------------------------------------------------


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps(
            {"type": self.headers["Content-Type"], "size": len(body), "path": self.path}
        ).encode()
        self.send_response(201 if self.path == "/created" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_http_posts_over_one_connection(echo_port):
    client = area.Http(echo_port)
    try:
        status, body = client.post("/x", b"abc", content_type="text/csv")
        assert status == 200
        assert json.loads(body) == {"type": "text/csv", "size": 3, "path": "/x"}
        assert client.post_json("/y", b"{}")["path"] == "/y"
        latencies = client.timed_posts("/created", [b"1", b"22", b"333"], warmup=1, expect=(201,))
        assert len(latencies) == 2
        assert all(value > 0 for value in latencies)
        with pytest.raises(BenchError, match="answered 200"):
            client.timed_posts("/x", [b"1"], expect=(201,))
    finally:
        client.close()


def test_the_features_area_is_found_and_describes_itself():
    assert "features" in harness.discover_areas()
    assert "feast_peer" not in harness.discover_areas()
    module = harness.load_area("features")
    assert module.__doc__.strip().splitlines()[0].startswith("Features:")
    for measure in (
        "online_1x50_p99_ms",
        "online_100x50_p99_ms",
        "ingest_json_rows_per_s",
        "ingest_parquet_rows_per_s",
    ):
        assert measure in module.__doc__


class _Recorder:
    """Stands in for an Http client: records which bodies it was sent, in order."""

    def __init__(self, name: str, log: list[tuple[str, bytes]]) -> None:
        self.name, self.log = name, log

    def timed_posts(self, path, bodies, **_):
        self.log.extend((self.name, body) for body in bodies)
        return [1.0 if self.name == "a" else 2.0 for _ in bodies]


@pytest.mark.parametrize(
    ("block", "turn_warmup", "order"),
    [
        (1, 0, "abbaabbaabbaab"),
        (3, 0, "aaabbbbbbaaaab"),
        (3, 1, "AaaaBbbbBbbbAaaaAaBb"),
        (100, 2, "AAaaaaaaaBBbbbbbbb"),
    ],
)
def test_timed_side_by_side_takes_turns_by_blocks(block, turn_warmup, order):
    log: list[tuple[str, bytes]] = []
    count = area.WARMUP + 7
    a_bodies = [f"a{i}".encode() for i in range(count)]
    b_bodies = [f"b{i}".encode() for i in range(count)]

    mine, theirs = area.timed_side_by_side(
        (_Recorder("a", log), "/a", a_bodies),
        (_Recorder("b", log), "/b", b_bodies),
        block=block,
        turn_warmup=turn_warmup,
    )

    assert mine == [1.0] * 7 and theirs == [2.0] * 7  # only the 7 planned requests are timed
    untimed = {b"a%d" % i for i in range(turn_warmup)} | {b"b%d" % i for i in range(turn_warmup)}
    turns = log[2 * area.WARMUP :]
    # Warm-up first (a, then b), then turns of `block` requests, each after `turn_warmup`
    # untimed ones (capitals); who starts alternates.
    assert "".join(n.upper() if body in untimed else n for n, body in turns) == order
    assert [body for n, body in turns if n == "a" and body not in untimed] == a_bodies[-7:]
    assert [body for n, body in turns if n == "b" and body not in untimed] == b_bodies[-7:]


def test_timed_side_by_side_refuses_unequal_or_bad_blocks():
    one = (_Recorder("a", []), "/a", [b"x"] * 3)
    with pytest.raises(ValueError, match="same number"):
        area.timed_side_by_side(one, (_Recorder("b", []), "/b", [b"y"] * 2))
    with pytest.raises(ValueError, match="at least 1"):
        area.timed_side_by_side(one, (_Recorder("b", []), "/b", [b"y"] * 3), block=0)
