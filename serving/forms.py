"""Browser forms of serving: register a version from a training job, deploy a version. They
parse input and call the services (``serving.registry``, ``serving.deployments``)."""

from __future__ import annotations

from django import forms

from serving.models import Deployment


def _choice_messages(choices: list[tuple[str, str]]) -> dict[str, str]:
    allowed = ", ".join(value for value, _ in choices) or "none available"
    return {"invalid_choice": f"Not one of the choices; use one of: {allowed}."}


class VersionRegisterForm(forms.Form):
    """The next version of a model, from a succeeded training job's bundle."""

    job = forms.ChoiceField(label="Succeeded training job")
    model = forms.CharField(label="Model name", max_length=63)
    description = forms.CharField(required=False, max_length=2000)

    def __init__(self, *args, workspace, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from training.models import JobState, TrainingJob

        jobs = (
            TrainingJob.objects.for_workspace(workspace)
            .filter(state=JobState.SUCCEEDED)
            .exclude(model_path="")
            .order_by("-id")[:100]
        )
        choices = [(str(j.pk), f"{j.name} #{j.pk}") for j in jobs]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["job"].choices = choices  # type: ignore[attr-defined]
        self.fields["job"].error_messages.update(_choice_messages(choices))


class DeployForm(forms.Form):
    """Send a version to a deployment: an existing one of its model (a release) or a new one."""

    deployment = forms.CharField(
        max_length=63,
        help_text="An existing deployment of this model is released to; a new name creates one.",
    )
    reason = forms.CharField(required=False, max_length=500)

    def __init__(self, *args, workspace, version, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.existing = {
            d.name: d
            for d in Deployment.objects.for_workspace(workspace)
            .filter(model=version.model)
            .select_related("model", "version")
        }
