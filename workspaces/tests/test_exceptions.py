"""ReferenceNotFound: 404 naming the field in the API, a field error everywhere else."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from workspaces.api.errors import error_envelope_handler
from workspaces.exceptions import ReferenceNotFound


def test_the_api_answers_404_naming_the_field():
    response = error_envelope_handler(
        ReferenceNotFound("no such dataset in this workspace", attr="dataset"), {}
    )
    assert response.status_code == 404
    assert response.data == {
        "type": "not_found",
        "code": "not_found",
        "detail": "no such dataset in this workspace",
        "attr": "dataset",
    }


def test_a_bad_value_of_the_same_field_stays_400():
    response = error_envelope_handler(ValidationError({"dataset": "give a dataset id"}), {})
    assert response.status_code == 400
    assert (response.data["type"], response.data["attr"]) == ("validation_error", "dataset")


class _JobForm(forms.Form):
    dataset = forms.IntegerField()


def test_a_page_form_shows_it_as_an_error_of_its_field():
    """Page views catch ValidationError from the services they call: this is one."""
    form = _JobForm({"dataset": "42"})
    assert form.is_valid()
    try:
        raise ReferenceNotFound("no such dataset in this workspace", attr="dataset")
    except ValidationError as exc:
        form.add_error(None, exc)
    assert form.errors == {"dataset": ["no such dataset in this workspace"]}
    assert form.has_error("dataset", code="not_found")
