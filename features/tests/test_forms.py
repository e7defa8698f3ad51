"""The feature registry's write pages through Django's test client: registering a group, editing
its schema (a new version), lifecycle moves with their conflicts, and uploading a file. Each form:
valid input creates the object and redirects (or shows the result); invalid input shows the
service's message next to its field and creates nothing; a viewer sees no button and is refused."""

from __future__ import annotations

import html

import pytest
from django.template.defaultfilters import floatformat
from django.test import Client
from django.urls import reverse

from features import registry
from features.models import Batch, FeatureGroup, FeatureGroupVersion, Lifecycle
from features.tests.factories import make_group
from features.tests.test_samples import builds_of
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def developer(workspace):
    return make_member(workspace, Role.DEVELOPER)


@pytest.fixture
def viewer(workspace):
    return make_member(workspace, Role.VIEWER)


@pytest.fixture
def maintainer(workspace):
    return make_member(workspace, Role.MAINTAINER)


def new_url(workspace) -> str:
    return reverse("features-new", kwargs={"ws": workspace.slug})


def group_url(workspace, name: str, suffix: str = "") -> str:
    view = {"": "features-group"}.get(suffix, f"features-group-{suffix}")
    return reverse(view, kwargs={"ws": workspace.slug, "name": name})


def group_post(**overrides) -> dict:
    data = {
        "name": "user_profile",
        "entity": "user",
        "entity_keys": "user_id",
        "freshness_sla_hours": "6",
        "online": "on",
        "description": "Profile features of a user.",
        "feature_name": ["age", "ctr_7d", "emb", ""],
        "feature_dtype": ["int", "float", "embedding", "float"],
        "feature_dimension": ["", "", "8", ""],
        "feature_description": ["Age in years.", "", "", ""],
    }
    data.update(overrides)
    return data


def text(response) -> str:
    return html.unescape(response.content.decode())


# New feature group -------------------------------------------------------------------------------


def test_the_form_lists_the_allowed_dtypes_and_entities(workspace, developer):
    response = browser(developer).get(new_url(workspace))
    assert response.status_code == 200
    page = text(response)
    for dtype in ("int", "float", "bool", "string", "categorical", "embedding"):
        assert f'<option value="{dtype}"' in page
    for entity in ("user", "item", "context", "semantic", "label"):
        assert f'<option value="{entity}"' in page
    assert 'id="schema-row-template"' in page
    assert "data-add-row" in page


def test_a_developer_registers_a_group_through_the_form(workspace, developer):
    client = browser(developer)
    response = client.post(new_url(workspace), group_post())
    assert response.status_code == 302
    assert response["Location"] == group_url(workspace, "user_profile")
    group = FeatureGroup.objects.for_workspace(workspace).get(name="user_profile")
    assert (group.entity, group.entity_keys, group.online) == ("user", ["user_id"], True)
    assert group.freshness_sla_seconds == 6 * 3600
    assert group.owner == developer
    version = FeatureGroupVersion.objects.for_workspace(workspace).get(group=group)
    assert [(s["name"], s["dtype"], s["dimension"]) for s in version.features] == [
        ("age", "int", None),
        ("ctr_7d", "float", None),
        ("emb", "embedding", 8),
    ]
    assert version.features[0]["description"] == "Age in years."
    page = text(client.get(response["Location"]))
    assert "Feature group 'user_profile' registered (v1)." in page


@pytest.mark.parametrize(
    ("overrides", "where", "message"),
    [
        (
            {"feature_dtype": ["int", "vector", "embedding"]},
            "row-error",
            "dtype: one of int, float, bool, string, categorical, embedding",
        ),
        (
            {"feature_dimension": ["", "", ""]},
            "row-error",
            "dimension: an embedding needs 1-4096",
        ),
        ({"feature_dimension": ["", "", "eight"]}, "row-error", "dimension: a whole number"),
        ({"feature_name": ["age", "age", "emb"]}, "row-error", "name: duplicate feature 'age'"),
        (
            {"feature_name": ["user_id", "ctr_7d", "emb"]},
            "row-error",
            "name: 'user_id' is a key or time column",
        ),
        (
            {"entity": "shop"},
            "field-error",
            "one of user, item, context, semantic, label",
        ),
        ({"entity_keys": ""}, "field-error", "This field is required."),
        (
            {"name": "User Profile"},
            "field-error",
            "Use 1-63 lowercase letters, digits and underscores, starting with a letter.",
        ),
        (
            {"feature_name": [""], "feature_dtype": ["float"], "feature_dimension": [""]},
            "schema-error",
            "give at least one feature",
        ),
    ],
)
def test_invalid_input_shows_the_error_beside_its_field_and_creates_nothing(
    workspace, developer, overrides, where, message
):
    response = browser(developer).post(new_url(workspace), group_post(**overrides))
    assert response.status_code == 400
    page = text(response)
    errors = [part.split("</", 1)[0] for part in page.split(f'data-testid="{where}">')[1:]]
    assert any(message in error for error in errors), (errors, message)
    assert not FeatureGroup.objects.for_workspace(workspace).exists()
    if "ctr_7d" in group_post(**overrides)["feature_name"]:
        assert 'value="ctr_7d"' in page  # what was typed is kept


def test_a_taken_name_is_a_conflict_shown_on_the_name_field(workspace, developer):
    make_group(workspace, name="user_profile")
    response = browser(developer).post(new_url(workspace), group_post())
    assert response.status_code == 400
    page = text(response)
    field = page.split('data-field="name"', 1)[1].split('data-field="entity"', 1)[0]
    assert "feature group 'user_profile' already exists" in field
    assert FeatureGroup.objects.for_workspace(workspace).count() == 1


def test_a_viewer_sees_no_create_button_and_is_refused(workspace, developer, viewer):
    list_url = reverse("features-list", kwargs={"ws": workspace.slug})
    assert 'data-testid="new-group"' in text(browser(developer).get(list_url))
    page = text(browser(viewer).get(list_url))
    assert 'data-testid="new-group"' not in page
    assert new_url(workspace) not in page
    assert browser(viewer).get(new_url(workspace)).status_code == 403
    assert browser(viewer).post(new_url(workspace), group_post()).status_code == 403
    assert not FeatureGroup.objects.for_workspace(workspace).exists()


def test_an_outsider_gets_404_and_anonymous_is_sent_to_log_in(workspace, other_workspace):
    outsider = make_member(other_workspace, Role.ADMIN)
    assert browser(outsider).post(new_url(workspace), group_post()).status_code == 404
    anonymous = Client().post(new_url(workspace), group_post())
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    assert not FeatureGroup.objects.for_workspace(workspace).exists()


def test_the_empty_list_says_what_to_do_and_links_to_the_form(workspace, developer, viewer):
    list_url = reverse("features-list", kwargs={"ws": workspace.slug})
    page = text(browser(developer).get(list_url))
    empty = page.split('class="empty">', 1)[1].split("</td>", 1)[0]
    assert f'<a href="{new_url(workspace)}">Register the first one</a>' in empty
    assert "upload a CSV, Parquet or JSON file" in empty
    assert "developer role" in text(browser(viewer).get(list_url))


# Schema edit -------------------------------------------------------------------------------------


def schema_post(names, dtypes, dimensions) -> dict:
    return {"feature_name": names, "feature_dtype": dtypes, "feature_dimension": dimensions}


def test_the_schema_page_starts_from_the_current_version(workspace, developer):
    make_group(workspace, name="profile")
    page = text(browser(developer).get(group_url(workspace, "profile", "schema")))
    for name in ("age", "ctr_7d", "is_new", "city", "emb"):
        assert f'value="{name}"' in page
    assert 'value="3"' in page  # the embedding's dimension
    assert "Save as v2" in page


def test_editing_the_schema_makes_a_new_version(workspace, developer):
    group = make_group(workspace, name="profile")
    response = browser(developer).post(
        group_url(workspace, "profile", "schema"),
        schema_post(["age", "ctr_30d"], ["int", "float"], ["", ""]),
    )
    assert response.status_code == 302
    group.refresh_from_db()
    assert group.current_version == 2
    latest = group.versions.get(version=2)
    assert [s["name"] for s in latest.features] == ["age", "ctr_30d"]


def test_an_unchanged_or_invalid_schema_is_refused_with_its_reason(workspace, developer):
    group = make_group(workspace, name="profile")
    client = browser(developer)
    url = group_url(workspace, "profile", "schema")
    unchanged = schema_post(
        ["age", "ctr_7d", "is_new", "city", "emb"],
        ["int", "float", "bool", "categorical", "embedding"],
        ["", "", "", "", "3"],
    )
    response = client.post(url, unchanged)
    assert response.status_code == 400
    assert "the schema is unchanged" in text(response)
    response = client.post(url, schema_post(["age", "x"], ["int", "tensor"], ["", ""]))
    assert response.status_code == 400
    row = text(response).split('value="x"', 1)[1].split("</tr>", 1)[0]
    assert "dtype: one of int, float, bool, string, categorical, embedding" in row
    group.refresh_from_db()
    assert group.current_version == 1


def test_a_viewer_cannot_edit_the_schema(workspace, viewer):
    group = make_group(workspace, name="profile")
    url = group_url(workspace, "profile", "schema")
    assert browser(viewer).get(url).status_code == 403
    response = browser(viewer).post(url, schema_post(["age"], ["int"], [""]))
    assert response.status_code == 403
    group.refresh_from_db()
    assert group.current_version == 1
    page = text(browser(viewer).get(group_url(workspace, "profile")))
    assert url not in page
    assert 'data-testid="group-actions"' not in page
    assert 'data-testid="upload"' not in page


# Lifecycle ---------------------------------------------------------------------------------------


def test_a_developer_activates_a_draft_but_cannot_deprecate(workspace, developer):
    group = make_group(workspace, name="profile", status=Lifecycle.DRAFT)
    client = browser(developer)
    page = text(client.get(group_url(workspace, "profile")))
    assert 'data-move="active"' in page
    assert 'data-move="retired"' not in page  # retiring needs a maintainer
    url = group_url(workspace, "profile", "lifecycle")
    response = client.post(url, {"status": "active"}, follow=True)
    assert "'profile' is now active." in text(response)
    group.refresh_from_db()
    assert group.status == Lifecycle.ACTIVE
    assert client.post(url, {"status": "deprecated"}).status_code == 403
    group.refresh_from_db()
    assert group.status == Lifecycle.ACTIVE


def test_retiring_a_group_in_use_shows_the_conflict(workspace, maintainer):
    group = make_group(workspace, name="profile")
    registry.consumer_register(
        actor=None, group=group, kind="model", object_id=7, label="ctr-model v3"
    )
    client = browser(maintainer)
    url = group_url(workspace, "profile", "lifecycle")
    response = client.post(url, {"status": "retired"}, follow=True)
    assert response.status_code == 200
    assert "Conflict: cannot retire 'profile': used by model ctr-model v3" in text(response)
    group.refresh_from_db()
    assert group.status == Lifecycle.ACTIVE
    response = client.post(url, {"status": "deprecated"}, follow=True)
    assert "'profile' is now deprecated." in text(response)
    response = client.post(url, {"status": "draft"}, follow=True)
    assert "Conflict: 'profile' cannot go from deprecated to draft" in text(response)
    response = client.post(url, {"status": "gone"}, follow=True)
    assert "status: one of draft, active, deprecated, retired" in text(response)
    group.refresh_from_db()
    assert group.status == Lifecycle.DEPRECATED


def test_a_viewer_cannot_move_a_group(workspace, viewer):
    group = make_group(workspace, name="profile", status=Lifecycle.DRAFT)
    url = group_url(workspace, "profile", "lifecycle")
    assert browser(viewer).post(url, {"status": "active"}).status_code == 403
    group.refresh_from_db()
    assert group.status == Lifecycle.DRAFT


# Upload ------------------------------------------------------------------------------------------

GOOD_CSV = (
    b"user_id,event_time,age,ctr_7d,is_new,city,emb\n"
    b'u1,2026-11-01T00:00:00+00:00,31,0.1,true,paris,"[1,2,3]"\n'
    b'u2,2026-11-01T01:00:00+00:00,32,0.2,false,lyon,"[1,2,4]"\n'
)


def upload(client, workspace, name: str, filename: str, body: bytes, **headers):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post(
        group_url(workspace, name, "upload"),
        {"file": SimpleUploadedFile(filename, body)},
        **headers,
    )


def test_uploading_a_csv_stores_its_rows_and_shows_them(workspace, developer):
    group = make_group(workspace, name="profile")
    response = upload(browser(developer), workspace, "profile", "users.csv", GOOD_CSV)
    assert response.status_code == 201
    page = text(response)
    assert '<strong data-testid="rows-stored">2</strong> rows from <code>users.csv</code>' in page
    assert "in version <strong>v1</strong>" in page
    batch = Batch.objects.for_workspace(workspace).get(group=group)
    assert (batch.rows, batch.format, batch.producer) == (2, "csv", developer)


def test_the_page_script_gets_only_the_result_fragment(workspace, developer):
    make_group(workspace, name="profile")
    response = upload(
        browser(developer),
        workspace,
        "profile",
        "users.csv",
        GOOD_CSV,
        HTTP_X_REQUESTED_WITH="XMLHttpRequest",
    )
    assert response.status_code == 201
    page = text(response)
    assert page.lstrip().startswith('<div class="upload-result"')
    assert "<html" not in page


def test_a_bad_file_is_refused_by_row_and_column_and_stores_nothing(workspace, developer):
    make_group(workspace, name="profile")
    bad = GOOD_CSV.replace(b",32,", b",thirty,")
    response = upload(browser(developer), workspace, "profile", "users.csv", bad)
    assert response.status_code == 400
    page = text(response)
    assert "Refused: nothing was stored." in page
    table = page.split('data-testid="upload-problems"', 1)[1]
    assert "<code>age</code>" in table
    assert "expected an integer" in table
    assert not Batch.objects.for_workspace(workspace).exists()


def test_a_file_of_another_kind_is_refused_naming_the_allowed_ones(workspace, developer):
    make_group(workspace, name="profile")
    response = upload(browser(developer), workspace, "profile", "users.xlsx", GOOD_CSV)
    assert response.status_code == 400
    assert "the file must end in one of .csv, .parquet, .json" in text(response)
    assert not Batch.objects.for_workspace(workspace).exists()


def test_a_viewer_cannot_upload(workspace, viewer):
    make_group(workspace, name="profile")
    response = upload(browser(viewer), workspace, "profile", "users.csv", GOOD_CSV)
    assert response.status_code == 403
    assert not Batch.objects.for_workspace(workspace).exists()


# New dataset -------------------------------------------------------------------------------------


@pytest.fixture
def sources(workspace, developer):
    """A labelled-events group ``clicks`` and a user group ``profile``, each with a few rows."""
    from features import ingestion

    clicks = registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="clicks",
        entity="label",
        entity_keys=["user_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    profile = make_group(workspace, name="profile")
    csv_clicks = (
        b"user_id,event_time,clicked\n"
        b"u1,2026-11-01T03:00:00+00:00,1\nu2,2026-11-01T04:00:00+00:00,0\n"
    )
    for group, body in ((clicks, csv_clicks), (profile, GOOD_CSV)):
        ingestion.batch_ingest(actor=developer, group=group, body=body, format="csv")
    return clicks, profile


def dataset_url(workspace) -> str:
    return reverse("features-dataset-new", kwargs={"ws": workspace.slug})


def dataset_post(**overrides) -> dict:
    data = {
        "name": "ctr_train",
        "label_source": "clicks",
        "label_columns": "clicked",
        "features": ["profile:age", "profile:ctr_7d"],
        "start_time": "2026-10-01T00:00",
        "end_time": "",
    }
    data.update(overrides)
    return data


def test_the_dataset_form_lists_groups_and_registry_features(workspace, developer, sources):
    page = text(browser(developer).get(dataset_url(workspace)))
    assert '<option value="clicks"' in page and '<option value="profile"' in page
    for ref in ("profile:age", "profile:emb", "clicks:clicked"):
        assert f'value="{ref}"' in page
    assert "data-feature-search" in page


def test_a_developer_builds_a_dataset_through_the_form(
    workspace, developer, sources, eager_celery, django_capture_on_commit_callbacks
):
    from features.models import Dataset

    client = browser(developer)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        response = client.post(dataset_url(workspace), dataset_post())
    assert response.status_code == 302
    assert len(builds_of(queued)) == 1  # the build task, sent after the commit
    dataset = Dataset.objects.for_workspace(workspace).get(name="ctr_train")
    assert response["Location"] == reverse(
        "features-dataset", kwargs={"ws": workspace.slug, "name": "ctr_train", "version": 1}
    )
    assert (dataset.status, dataset.row_count) == ("ready", 2)
    assert dataset.feature_refs == ["profile:age", "profile:ctr_7d"]
    assert dataset.start_time.isoformat() == "2026-10-01T00:00:00+00:00"
    page = text(client.get(response["Location"]))
    assert "Dataset 'ctr_train' v1: building." in page  # the flash from the request
    assert 'data-testid="building"' not in page
    assert "hx-trigger" not in page


def progress_url(workspace, name="ctr_train", version=1) -> str:
    return reverse(
        "features-dataset-progress",
        kwargs={"ws": workspace.slug, "name": name, "version": version},
    )


def test_a_building_dataset_shows_a_progress_bar_that_refreshes_until_it_is_built(
    workspace, developer, sources, eager_celery, django_capture_on_commit_callbacks
):
    from features.models import Dataset

    client = browser(developer)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        client.post(dataset_url(workspace), dataset_post())
    dataset = Dataset.objects.for_workspace(workspace).get(name="ctr_train")
    assert (dataset.status, dataset.rows_total, dataset.rows_done) == ("building", None, 0)
    page_url = reverse(
        "features-dataset", kwargs={"ws": workspace.slug, "name": "ctr_train", "version": 1}
    )
    page = text(client.get(page_url))
    assert "Building: the point-in-time join is running." in page
    assert f'hx-get="{progress_url(workspace)}" hx-trigger="every 2s"' in page
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in page

    queued_bar = client.get(progress_url(workspace), HTTP_HX_REQUEST="true")
    assert "Queued" in text(queued_bar) and "HX-Refresh" not in queued_bar

    Dataset.objects.for_workspace(workspace).filter(pk=dataset.pk).update(
        rows_total=2, rows_done=1, partitions_total=3, partitions_done=1
    )
    halfway = text(client.get(progress_url(workspace)))
    assert '<progress aria-label="Build progress" max="2" value="1">' in halfway
    assert "1 of 2 rows written (50%); 1 of 3 partitions joined" in halfway
    assert 'hx-trigger="every 2s"' in halfway
    listing = text(client.get(reverse("features-datasets", kwargs={"ws": workspace.slug})))
    assert '<span class="muted small" data-testid="list-progress">50%</span>' in listing

    for callback in queued:  # the worker runs the build
        callback()
    done = client.get(progress_url(workspace), HTTP_HX_REQUEST="true")
    assert done["HX-Refresh"] == "true"  # htmx reloads the page, which shows the result
    assert "hx-trigger" not in text(done)
    built = Dataset.objects.for_workspace(workspace).get(pk=dataset.pk)
    assert built.engine == "duckdb" and built.build_seconds is not None
    seconds = floatformat(built.build_seconds, 1)
    assert f"Built: 2 rows by duckdb in {seconds} s, as 1 Parquet part." in text(done)
    page = text(client.get(page_url))
    assert 'data-testid="building"' not in page and "hx-trigger" not in page


def test_a_failed_build_shows_its_error(
    workspace, developer, sources, eager_celery, django_capture_on_commit_callbacks, monkeypatch
):
    from features import samples

    def broken(dataset):
        raise OSError("disk full")

    monkeypatch.setattr(samples, "_write_file", broken)
    client = browser(developer)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(dataset_url(workspace), dataset_post())
    page = text(
        client.get(
            reverse(
                "features-dataset",
                kwargs={"ws": workspace.slug, "name": "ctr_train", "version": 1},
            )
        )
    )
    assert 'data-testid="status">failed<' in page
    assert '<p class="error" data-testid="error">OSError: disk full</p>' in page
    assert "hx-trigger" not in page
    bar = client.get(progress_url(workspace), HTTP_HX_REQUEST="true")
    assert bar["HX-Refresh"] == "true"
    assert "The build failed: OSError: disk full" in text(bar)


def preview_url(workspace) -> str:
    return reverse("features-dataset-preview", kwargs={"ws": workspace.slug})


def test_the_form_has_a_preview_button_that_posts_the_form(workspace, developer, sources):
    page = text(browser(developer).get(dataset_url(workspace)))
    assert f'hx-post="{preview_url(workspace)}"' in page
    assert 'hx-include="closest form" hx-target="#dataset-preview"' in page


def test_preview_shows_row_count_and_coverage_and_creates_nothing(
    workspace, developer, sources, django_capture_on_commit_callbacks
):
    from features.models import Dataset
    from workspaces.models import Event

    events = Event.objects.for_workspace(workspace).count()
    client = browser(developer)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        whole = client.post(preview_url(workspace), dataset_post(name=""), HTTP_HX_REQUEST="true")
        # The window ends at 03:30: only u1's label (03:00) is inside.
        part = client.post(
            preview_url(workspace),
            dataset_post(end_time="2026-11-01T03:30", features=["profile:age"]),
        )
    assert whole.status_code == 200, text(whole)
    assert '<strong data-testid="preview-rows">2</strong> label rows in the window' in text(whole)
    assert text(whole).count('data-testid="preview-coverage">100.0%') == 2
    assert part.status_code == 200
    assert '<strong data-testid="preview-rows">1</strong> label row in the window' in text(part)
    assert not Dataset.objects.for_workspace(workspace).exists()
    assert Event.objects.for_workspace(workspace).count() == events
    assert queued == []


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"label_columns": "bought"}, "label_columns", "'clicks' has no column 'bought'"),
        ({"features": []}, "features", "This field is required."),
        ({"label_source": "ghost"}, "label_source", "one of clicks, profile"),
    ],
)
def test_preview_of_bad_input_is_400_naming_the_field(
    workspace, developer, sources, overrides, field, message
):
    from features.models import Dataset

    response = browser(developer).post(preview_url(workspace), dataset_post(**overrides))
    assert response.status_code == 400
    assert f'<li data-field="{field}">' in text(response)
    assert message in text(response)
    assert not Dataset.objects.for_workspace(workspace).exists()


def test_a_viewer_cannot_preview_and_preview_takes_only_post(workspace, viewer, developer, sources):
    assert browser(viewer).post(preview_url(workspace), dataset_post()).status_code == 403
    assert browser(developer).get(preview_url(workspace)).status_code == 405


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"label_columns": "bought"}, "label_columns", "'clicks' has no column 'bought'"),
        ({"features": ["profile:nope"]}, "features", "Select a valid choice"),
        ({"features": []}, "features", "This field is required."),
        (
            {"start_time": "2026-11-02T00:00", "end_time": "2026-11-01T00:00"},
            "end_time",
            "must be after start_time",
        ),
        ({"label_source": "ghost"}, "label_source", "one of clicks, profile"),
    ],
)
def test_an_invalid_dataset_shows_the_error_beside_its_field(
    workspace, developer, sources, overrides, field, message
):
    from features.models import Dataset

    response = browser(developer).post(dataset_url(workspace), dataset_post(**overrides))
    assert response.status_code == 400
    page = text(response)
    block = page.split(f'data-field="{field}"', 1)[1].split("data-field=", 1)[0]
    assert message in block, block
    assert not Dataset.objects.for_workspace(workspace).exists()


def test_a_viewer_cannot_build_a_dataset(workspace, viewer, sources):
    from features.models import Dataset

    list_page = text(
        browser(viewer).get(reverse("features-datasets", kwargs={"ws": workspace.slug}))
    )
    assert 'data-testid="new-dataset"' not in list_page
    assert browser(viewer).get(dataset_url(workspace)).status_code == 403
    assert browser(viewer).post(dataset_url(workspace), dataset_post()).status_code == 403
    assert not Dataset.objects.for_workspace(workspace).exists()


def test_a_file_over_the_page_limit_is_refused_and_the_page_names_the_limit(
    workspace, developer, settings
):
    settings.FEATURE_BATCH_MAX_BYTES = 2048  # the batches' limit, on the page as on the API
    make_group(workspace, name="profile")
    client = browser(developer)
    page = text(client.get(group_url(workspace, "profile")))
    assert 'data-max-bytes="2048"' in page
    assert "Files up to 2.0\xa0KB here" in page  # filesizeformat joins with a no-break space
    response = upload(client, workspace, "profile", "users.csv", GOOD_CSV * 40)
    assert response.status_code == 413
    assert not Batch.objects.for_workspace(workspace).exists()


def feature_move_url(workspace, group: str, feature: str) -> str:
    return reverse(
        "features-feature-lifecycle",
        kwargs={"ws": workspace.slug, "name": group, "feature": feature},
    )


def test_retiring_a_feature_in_use_shows_the_conflict(workspace, maintainer):
    from features.models import Feature

    group = make_group(workspace, name="profile")
    registry.consumer_register(
        actor=None, group=group, kind="model", object_id=3, label="ctr v1", feature_name="age"
    )
    client = browser(maintainer)
    page = text(client.get(group_url(workspace, "profile")))
    row = page.split('<tr data-feature="age">', 1)[1].split("</tr>", 1)[0]
    assert 'data-feature-move="deprecated"' in row and 'data-feature-move="retired"' in row
    url = feature_move_url(workspace, "profile", "age")
    response = client.post(url, {"status": "retired"}, follow=True)
    assert "Conflict: cannot retire 'profile:age': used by model ctr v1" in text(response)
    age = Feature.objects.for_workspace(workspace).get(group=group, name="age")
    assert age.status == Lifecycle.ACTIVE
    response = client.post(feature_move_url(workspace, "profile", "city"), {"status": "retired"})
    assert response.status_code == 302
    city = Feature.objects.for_workspace(workspace).get(group=group, name="city")
    assert city.status == Lifecycle.RETIRED


def test_a_developer_deprecates_a_feature_but_cannot_retire_it(workspace, developer, viewer):
    from features.models import Feature

    group = make_group(workspace, name="profile")
    page = text(browser(developer).get(group_url(workspace, "profile")))
    row = page.split('<tr data-feature="age">', 1)[1].split("</tr>", 1)[0]
    assert 'data-feature-move="deprecated"' in row and 'data-feature-move="retired"' not in row
    url = feature_move_url(workspace, "profile", "age")
    assert browser(developer).post(url, {"status": "retired"}).status_code == 403
    assert browser(viewer).post(url, {"status": "deprecated"}).status_code == 403
    age = Feature.objects.for_workspace(workspace).get(group=group, name="age")
    assert age.status == Lifecycle.ACTIVE
    response = browser(developer).post(url, {"status": "deprecated"})
    assert response.status_code == 302
    age.refresh_from_db()
    assert age.status == Lifecycle.DEPRECATED
    missing = feature_move_url(workspace, "profile", "nope")
    assert browser(developer).post(missing, {"status": "deprecated"}).status_code == 404
