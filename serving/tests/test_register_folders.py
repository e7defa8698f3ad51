"""Registration reserves the version number under the model's lock before its folder gets the
number's name (issue 17): a crashed registration's leftover folder is replaced, and a refused one
leaves neither a row nor files."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from serving import registry
from serving.models import ModelVersion
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from workspaces.models import Role

pytestmark = pytest.mark.django_db


def _model_dir(workspace, name: str) -> Path:
    return Path(settings.ARTIFACT_ROOT) / f"{workspace.pk}/models/{name}"


def test_a_leftover_folder_at_the_next_number_is_replaced(workspace, members):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor)
    job = make_job(scene, make_bundle(make_spec(scene), seed=1))
    first = registry.model_version_register(actor=actor, workspace=workspace, name="r", job=job)
    # A registration of v2 copied its files and crashed before its transaction committed.
    leftover = _model_dir(workspace, "r") / "2"
    leftover.mkdir(parents=True)
    (leftover / "stray.bin").write_bytes(b"half-written")

    second = registry.model_version_register(actor=actor, workspace=workspace, name="r", job=job)

    assert (first.version, second.version) == (1, 2)
    assert not (leftover / "stray.bin").exists()
    assert sorted(p.name for p in leftover.iterdir()) == sorted(f["name"] for f in second.artifacts)
    registry.load_version(second)
    # No staging folders stay behind.
    assert sorted(p.name for p in _model_dir(workspace, "r").iterdir()) == ["1", "2"]


def test_a_registration_refused_after_the_copy_leaves_no_row_and_no_files(
    workspace, members, monkeypatch
):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor)
    job = make_job(scene, make_bundle(make_spec(scene), seed=2))

    def refuse(version):
        raise ValueError("not a loadable bundle")

    monkeypatch.setattr(registry, "load_version", refuse)
    with pytest.raises(ValueError, match="loadable"):
        registry.model_version_register(actor=actor, workspace=workspace, name="q", job=job)

    assert not ModelVersion.objects.for_workspace(workspace).filter(model__name="q").exists()
    folder = _model_dir(workspace, "q")
    assert not folder.exists() or not any(folder.iterdir())
