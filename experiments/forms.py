"""Browser forms of the experiments app: they parse input into the arguments of
``services.experiment_create`` / ``experiment_update`` and put the services' errors on the
fields they name; the rules themselves live in the services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from experiments import services as limits
from experiments.models import Experiment, Metric, SequentialMethod, Spending, Unit, key_validator

GUARDRAIL_FIELDS = {metric: f"guardrail_{metric}" for metric in Metric.values}


def _percent_list(raw: str) -> list[float]:
    values = []
    for part in raw.replace(";", ",").split(","):
        part = part.strip().rstrip("%").strip()
        if not part:
            continue
        try:
            values.append(float(part))
        except ValueError:
            raise ValidationError(
                f"'{part}' is not a number; write percents like 1, 5, 20"
            ) from None
    if not values:
        raise ValidationError("give at least one per-arm percent, e.g. 1, 5, 20")
    return values


# Guardrails are asked for in percent; the service's limit is a fraction.
GUARDRAIL_MAX_PERCENT = round(limits.MAX_GUARDRAIL_DROP * 100)


def guardrail_field(metric: str) -> forms.FloatField:
    """The form's field for one guardrail: how far ``metric`` may drop, in percent."""
    return forms.FloatField(
        label=f"Guardrail: {metric} may drop at most (%)",
        required=False,
        min_value=0,
        max_value=GUARDRAIL_MAX_PERCENT,
    )


class ExperimentForm(forms.Form):
    """A new experiment, or a draft's edit (then the key is fixed)."""

    key = forms.CharField(
        label="Name (key)",
        max_length=63,
        validators=[key_validator],
        help_text="Lowercase letters, digits, '-' and '_', starting with a letter; it names the "
        "experiment in URLs, the routing table and the prediction log.",
    )
    hypothesis = forms.CharField(
        label="Hypothesis / description",
        max_length=limits.MAX_HYPOTHESIS_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What you expect and why.",
    )
    deployment = forms.TypedChoiceField(
        coerce=int, help_text="Its production version is the control arm."
    )
    treatment_versions = forms.TypedMultipleChoiceField(
        coerce=int,
        label="Treatment version(s)",
        widget=forms.SelectMultiple(attrs={"size": 4}),
        help_text=f"1-{limits.MAX_TREATMENTS} versions of the deployment's model, other than the "
        "production one.",
    )
    layer = forms.CharField(
        max_length=63,
        initial="default",
        validators=[key_validator],
        help_text="An existing layer, or a new name to create one (its own salt).",
    )
    ramp_plan = forms.CharField(
        label="Traffic share per arm (ramp plan, %)",
        initial="1, 5, 20",
        help_text="Increasing per-arm percents, one step per ramp interval, e.g. 1, 5, 20.",
    )
    ramp_interval_hours = forms.IntegerField(
        label="Hours between ramp steps",
        min_value=1,
        max_value=limits.MAX_RAMP_INTERVAL_S // 3600,
        initial=24,
    )
    unit = forms.ChoiceField(choices=Unit.choices, initial=Unit.USER)
    primary_metric = forms.ChoiceField(choices=Metric.choices, initial=Metric.CTR)
    guardrail_ctr = guardrail_field("CTR")
    guardrail_cvr = guardrail_field("CVR")
    guardrail_rpm = guardrail_field("revenue per mille")
    min_units = forms.IntegerField(
        label="Units per arm before judging",
        min_value=limits.MIN_UNITS,
        max_value=limits.MAX_UNITS,
        initial=100,
    )
    sequential_method = forms.ChoiceField(
        choices=SequentialMethod.choices,
        initial=SequentialMethod.GROUP_SEQUENTIAL,
        widget=forms.RadioSelect,
        help_text="How results read while it runs are judged; the decision banner uses it.",
    )
    spending = forms.ChoiceField(
        label="Alpha spending (group-sequential)",
        choices=Spending.choices,
        initial=Spending.OBRIEN_FLEMING,
    )

    def __init__(
        self,
        *args,
        deployments: list[tuple[int, str]],
        versions: list[tuple[int, str]],
        editing: Experiment | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["deployment"].choices = [("", "Choose a deployment"), *deployments]  # type: ignore[attr-defined]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["treatment_versions"].choices = versions  # type: ignore[attr-defined]
        self.editing = editing
        self.fields["layer"].widget.attrs["list"] = "layer-names"
        if editing is not None:
            self.fields["key"].disabled = True
            self.fields["key"].initial = editing.key

    @staticmethod
    def initial_of(exp: Experiment) -> dict[str, Any]:
        guardrails = {g["metric"]: g["max_drop"] for g in exp.guardrails}
        return {
            "key": exp.key,
            "hypothesis": exp.hypothesis,
            "deployment": exp.deployment_id,
            "treatment_versions": [arm["version_id"] for arm in exp.arms[1:]],
            "layer": exp.layer.name,
            "ramp_plan": ", ".join(f"{p:g}" for p in exp.ramp_plan),
            "ramp_interval_hours": max(1, round(exp.ramp_interval_s / 3600)),
            "unit": exp.unit,
            "primary_metric": exp.primary_metric,
            **{
                field: round(guardrails[metric] * 100, 4)
                for metric, field in GUARDRAIL_FIELDS.items()
                if metric in guardrails
            },
            "min_units": exp.min_units,
            "sequential_method": exp.sequential_method,
            "spending": exp.spending,
        }

    def clean_ramp_plan(self) -> list[float]:
        return _percent_list(self.cleaned_data["ramp_plan"])

    def spec(self) -> dict[str, Any]:
        """The service's keyword arguments (without actor, workspace and, when editing, key)."""
        data = self.cleaned_data
        spec = {
            "hypothesis": data["hypothesis"],
            "deployment": data["deployment"],
            "treatment_versions": list(data["treatment_versions"]),
            "layer": data["layer"],
            "unit": data["unit"],
            "primary_metric": data["primary_metric"],
            "guardrails": [
                {"metric": metric, "max_drop": data[field] / 100}
                for metric, field in GUARDRAIL_FIELDS.items()
                if data.get(field) is not None
            ],
            "ramp_plan": data["ramp_plan"],
            "ramp_interval_s": data["ramp_interval_hours"] * 3600,
            "min_units": data["min_units"],
            "sequential_method": data["sequential_method"],
            "spending": data["spending"],
        }
        if self.editing is None:
            spec["key"] = data["key"]
        return spec

    def add_service_error(self, exc: ValidationError) -> None:
        """Put a service's ``{attr: message}`` errors on the fields they name (``guardrails.0``
        on the first guardrail field, ``ramp_interval_s`` on the hours); others on the form."""
        if not hasattr(exc, "error_dict"):
            self.add_error(None, exc.messages)
            return
        aliases = {"ramp_interval_s": "ramp_interval_hours"}
        for attr, errors in exc.message_dict.items():
            field = aliases.get(attr, attr.split(".")[0])
            if field == "guardrails":
                field = next(
                    (f for f in GUARDRAIL_FIELDS.values() if self.cleaned_data.get(f) is not None),
                    None,
                )
            self.add_error(field if field in self.fields else None, errors)
