"""An experiment's field limits live in the service (``experiments.services``); the API
serializer and the form read them, so the three refuse the same values."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from experiments import services
from experiments.api.serializers import ExperimentCreateSerializer
from experiments.forms import GUARDRAIL_MAX_PERCENT, ExperimentForm

pytestmark = pytest.mark.django_db

VALID = {"key": "exp-a", "hypothesis": "h", "deployment": "main", "treatment_versions": [1]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ramp_interval_s", services.MAX_RAMP_INTERVAL_S + 1),
        ("min_units", services.MAX_UNITS + 1),
        ("min_units", services.MIN_UNITS - 1),
        ("alpha", services.MAX_ALPHA * 2),
        ("hypothesis", "x" * (services.MAX_HYPOTHESIS_CHARS + 1)),
        ("treatment_versions", list(range(1, services.MAX_TREATMENTS + 2))),
        ("ramp_plan", [float(i) for i in range(1, services.MAX_RAMP_STEPS + 2)]),
    ],
)
def test_the_serializer_refuses_past_the_services_limits(field, value):
    serializer = ExperimentCreateSerializer(data={**VALID, field: value})
    assert not serializer.is_valid()
    assert set(serializer.errors) == {field}
    at_limit = {
        "ramp_interval_s": services.MAX_RAMP_INTERVAL_S,
        "min_units": services.MAX_UNITS,
        "alpha": services.MAX_ALPHA,
        "hypothesis": "x" * services.MAX_HYPOTHESIS_CHARS,
        "treatment_versions": list(range(1, services.MAX_TREATMENTS + 1)),
        "ramp_plan": [float(i) for i in range(1, services.MAX_RAMP_STEPS + 1)],
    }[field]
    assert ExperimentCreateSerializer(data={**VALID, field: at_limit}).is_valid()


def test_the_service_refuses_a_long_hypothesis_instead_of_cutting_it(workspace, members):
    with pytest.raises(ValidationError) as caught:
        services.experiment_create(
            actor=members["developer"],
            workspace=workspace,
            key="exp-a",
            hypothesis="x" * (services.MAX_HYPOTHESIS_CHARS + 1),
            deployment="main",
            treatment_versions=[1],
        )
    assert set(caught.value.message_dict) == {"hypothesis"}


def test_the_form_reads_the_same_limits():
    fields = ExperimentForm.base_fields
    assert fields["hypothesis"].max_length == services.MAX_HYPOTHESIS_CHARS
    assert fields["min_units"].max_value == services.MAX_UNITS
    assert fields["ramp_interval_hours"].max_value * 3600 == services.MAX_RAMP_INTERVAL_S
    assert GUARDRAIL_MAX_PERCENT / 100 == services.MAX_GUARDRAIL_DROP
