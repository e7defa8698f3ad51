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


ACTIVATIONS = [("", "no state dict (a flavor's model)"), ("relu", "relu"), ("tanh", "tanh"),
               ("sigmoid", "sigmoid")]  # fmt: skip
OUTPUTS = [("probability", "probability"), ("logit", "logit")]


class MlflowImportForm(forms.Form):
    """Import a model logged with the stock MLflow client (``model_version_import_mlflow``): its
    source, the dataset its inputs come from and the input mapping, one input per line as
    ``column = group:feature`` (a column signature) or ``group:feature`` in input order (a tensor
    or a state dict); a name without ``:`` is a plain input the request supplies."""

    model = forms.CharField(label="Model name", max_length=63)
    source = forms.CharField(
        max_length=1000,
        help_text="runs:/<run id>/<path>, models:/m-<id> or models:/<ws>.<name>/<v>",
    )
    dataset = forms.ChoiceField(label="Training dataset", required=False)
    inputs = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="column = group:feature per line, or group:feature per line in input order",
    )
    activation = forms.ChoiceField(
        choices=ACTIVATIONS, required=False, label="State dict architecture (mlp activation)"
    )
    output = forms.ChoiceField(choices=OUTPUTS, initial="probability")

    def __init__(self, *args, workspace, **kwargs) -> None:
        # Its ids differ from the register form's on the same page (both have a ``model``).
        kwargs.setdefault("auto_id", "import_%s")
        super().__init__(*args, **kwargs)
        from features.selectors import datasets_of

        datasets = datasets_of(workspace=workspace).filter(status="ready")[:100]
        choices = [("", "none (plain inputs only)")] + [
            (str(d.pk), f"{d.name} v{d.version}") for d in datasets
        ]
        self.fields["dataset"].choices = choices  # type: ignore[attr-defined]
        for name in ("dataset", "activation", "output"):
            field = self.fields[name]
            field.error_messages.update(_choice_messages(field.choices))  # type: ignore[attr-defined]

    def clean_inputs(self) -> dict[str, str] | list[str]:
        lines = [line.strip() for line in self.cleaned_data["inputs"].splitlines() if line.strip()]
        pairs = [line.partition("=") for line in lines]
        if all(sep for _, sep, _ in pairs):
            return {left.strip(): right.strip() for left, _, right in pairs}
        if any(sep for _, sep, _ in pairs):
            raise forms.ValidationError(
                "Use one form for every line: 'column = group:feature', or 'group:feature' alone."
            )
        return lines


class BenchmarkSetForm(forms.Form):
    """The next version of a benchmark set, over a ready dataset or record set."""

    name = forms.CharField(
        max_length=63,
        help_text="Lowercase letters, digits, '-' and '_'. An existing name makes its next "
        "version.",
    )
    source = forms.ChoiceField(
        label="Rows",
        help_text="A dataset or a ranking record set makes a ranking set (AUC, log loss, ECE, "
        "NDCG); a record set of instructions or chats a language set (exact match, token F1, "
        "ROUGE-L, perplexity).",
    )
    label_column = forms.CharField(
        required=False, max_length=200, help_text="0/1 labels. Default: the dataset's label."
    )
    group_column = forms.CharField(
        required=False,
        max_length=200,
        help_text="Rows of one request or user, for NDCG. Default: the dataset's entity key.",
    )
    ndcg_k = forms.IntegerField(
        label="NDCG at k", min_value=1, max_value=1000, initial=10, help_text="1 to 1000."
    )
    max_new_tokens = forms.IntegerField(
        min_value=1, max_value=256, initial=64, help_text="Language sets: 1 to 256 tokens."
    )
    description = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)

    def __init__(self, *args, workspace, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from curation.selectors import record_sets_of
        from features.selectors import datasets_of

        choices = [
            (f"dataset:{d.pk}", f"dataset {d.name} v{d.version} ({d.row_count} rows)")
            for d in datasets_of(workspace=workspace).filter(status="ready")[:200]
        ] + [
            (f"record_set:{r.pk}", f"record set {r.name} v{r.version} ({r.row_count} rows)")
            for r in record_sets_of(workspace=workspace).filter(status="ready")[:200]
        ]
        self.fields["source"].choices = choices  # type: ignore[attr-defined]
        self.fields["source"].error_messages.update(_choice_messages(choices))


class RankerTryForm(forms.Form):
    """The playground's request for a ranking version: rows of raw feature values (JSON)."""

    rows = forms.CharField(
        label="Request rows (JSON)",
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false", "class": "mono"}),
        help_text="A list of objects, one per candidate, keyed by feature reference; a "
        "feature left out is missing (as a null in the online store). At most 100 rows.",
    )


class LanguageTryForm(forms.Form):
    """The playground's prompt for a language-model version."""

    prompt = forms.CharField(
        label="Prompt",
        max_length=4000,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8}),
        help_text="Continued greedily. An instruction-tuned version expects the prompt as its "
        "training rendered one: '### Instruction:' ... '### Response:'.",
    )
    max_new_tokens = forms.IntegerField(
        label="Max new tokens",
        initial=64,
        min_value=1,
        max_value=256,
        error_messages={"min_value": "At least 1 token.", "max_value": "At most 256 tokens."},
    )
