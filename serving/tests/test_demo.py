import io

import pytest

from serving.demo import DEMO_DEPLOYMENT, run_serving_demo
from serving.models import Deployment, ModelVersion
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from workspaces.demo import demo_steps
from workspaces.testing.factories import make_workspace


def test_the_serving_step_is_registered_at_30():
    assert any(s.order == 30 and s.name == "serving" for s in demo_steps())


@pytest.mark.django_db
def test_demo_registers_gates_and_deploys_the_trained_model_once():
    out = io.StringIO()
    run_serving_demo("http://testserver", out)
    assert "no workspace" in out.getvalue()
    workspace = make_workspace(slug="feed-pctr")
    scene = make_scene(workspace, None, labels=20)
    make_job(scene, make_bundle(make_spec(scene)))
    run_serving_demo("http://testserver", out)
    dep = Deployment.objects.for_workspace(workspace).get(name=DEMO_DEPLOYMENT)
    assert dep.version.gate_status == "passed"
    run_serving_demo("http://testserver", out)  # idempotent
    assert ModelVersion.objects.for_workspace(workspace).count() == 1
    assert "already serves" in out.getvalue()
