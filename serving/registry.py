"""The model registry (S1): registered models and versions, aliases, MLflow kept in step.

A version is registered from a training job's bundle (or an import from the stock MLflow client);
its files are hard-linked (or copied) into ``ARTIFACT_ROOT/<ws>/models/<name>/<version>/`` so the
registry owns an immutable copy, and MLflow's registry gets the same model name
(``<workspace-slug>.<name>``) and version so ``mlflow.MlflowClient`` lists the same versions.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max

from serving import artifacts, mlflow_models
from serving.models import ModelVersion, RegisteredModel, VersionSource, name_validator
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

if TYPE_CHECKING:
    from features.models import Dataset
    from training.bundle import Bundle, BundleSpec
    from training.models import TrainingJob

log = logging.getLogger(__name__)
ALIASES = ("production", "candidate", "staging", "champion", "challenger")


def mlflow_name(workspace: Workspace, name: str) -> str:
    return f"{workspace.slug}.{name}"


_clients: dict[str, Any] = {}


def mlflow_client() -> Any:  # mlflow.MlflowClient, imported late (seconds)
    """One client per tracking URI per process (building a SQL store costs over a second)."""
    import mlflow

    uri = settings.MLFLOW_TRACKING_URI
    client = _clients.get(uri)
    if client is None:
        client = _clients[uri] = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    return client


def version_dir(workspace: Workspace, name: str, version: int) -> str:
    return f"{workspace.pk}/models/{name}/{version}"


def load_version(version: ModelVersion) -> Bundle:
    """The version's bundle, read from its platform-written path (tensors only, no pickle)."""
    from training.bundle import load_bundle

    path = artifacts.resolve_artifact(version.artifact_path, attr="artifact_path")
    artifacts.check_bundle_dir(path, attr="artifact_path")
    try:
        return load_bundle(path)
    except Exception as exc:
        raise ValidationError(
            {"artifact_path": f"model artifact refused: {type(exc).__name__}: {str(exc)[:200]}"}
        ) from exc


def check_loadable(version: ModelVersion) -> None:
    """Refuse (400 naming the artifact) a version whose files do not load: a ranking bundle is
    loaded (tensors only, no pickle); a language model, which may be large, has its config and
    its safetensors header read instead of its weights: a LoRA adapter's
    (``training.bundle.check_adapter``) or a whole model's (``check_full_model``)."""
    from training.bundle import check_language_model, is_language_model

    template = str((version.spec or {}).get("template") or "")
    if not is_language_model(template):
        load_version(version)
        return

    path = artifacts.resolve_artifact(version.artifact_path, attr="artifact_path")
    try:
        check_language_model(path, template)
    except (ValueError, OSError) as exc:
        raise ValidationError(
            {"artifact_path": f"model artifact refused: {type(exc).__name__}: {str(exc)[:200]}"}
        ) from exc


def _model_get_or_create(*, actor: Actor, workspace: Workspace, name: str) -> RegisteredModel:
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from exc
    model = RegisteredModel.objects.for_workspace(workspace).filter(name=name).first()
    if model is not None:
        return model
    model = RegisteredModel.objects.create(
        workspace=workspace,
        name=name,
        mlflow_name=mlflow_name(workspace, name),
        created_by=actor_user(actor),
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.registered_model.created",
        refs=[Ref.to(model)],
        payload={"name": name},
    )
    return model


def _register_consumers(*, actor: Actor, version: ModelVersion) -> None:
    from features.models import ConsumerKind, FeatureGroup
    from features.services import consumer_register

    groups: dict[str, Any] = {}
    for ref in version.features:
        group_name, _, feature = ref.partition(":")
        group_name = group_name.split("@")[0]
        if group_name not in groups:
            groups[group_name] = (
                FeatureGroup.objects.for_workspace(version.workspace)
                .filter(name=group_name)
                .first()
            )
        group = groups[group_name]
        if group is None:
            continue
        try:
            consumer_register(
                actor=actor,
                group=group,
                kind=ConsumerKind.MODEL,
                object_id=version.pk,
                label=str(version),
                feature_name=feature,
            )
        except ValidationError:
            continue  # a feature renamed since training: the gate will report it


def _sync_mlflow(version: ModelVersion) -> None:
    """Create the registered model and version in MLflow's registry (best effort, logged)."""
    try:
        client = mlflow_client()
        name = version.model.mlflow_name or mlflow_name(version.workspace, version.model.name)
        try:
            client.get_registered_model(name)
        except Exception:  # noqa: BLE001 (mlflow raises RestException/MlflowException)
            client.create_registered_model(name, tags={"rankops.workspace": version.workspace.slug})
        path = artifacts.resolve_artifact(version.artifact_path)
        tags = {"rankops.version_id": str(version.pk), "rankops.version": str(version.version)}
        if urlsplit(str(client.tracking_uri)).scheme in ("http", "https"):
            mv = _mirror_over_http(client, name, version, path, tags)
        else:
            mv = client.create_model_version(
                name,
                source=path.as_uri(),
                run_id=version.mlflow_run_id or None,
                tags=tags,
                description=version.description[:500],
            )
        ModelVersion.objects.for_workspace(version.workspace).filter(pk=version.pk).update(
            mlflow_version=str(mv.version)
        )
        version.mlflow_version = str(mv.version)
    except Exception:
        log.exception("could not register %s in MLflow", version)


def _mirror_over_http(
    client: Any, name: str, version: ModelVersion, path: Path, tags: dict[str, str]
) -> Any:
    """An HTTP MLflow server cannot read the platform's files (a ``file://`` source is refused as
    ``Invalid model version source``): upload the version's folder (bundle and ``MLmodel``) as a
    logged model of the workspace's experiment and register that."""
    experiment_name = f"rankops/{version.workspace.slug}"
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(experiment_name)
    )
    logged = client.create_logged_model(
        experiment_id=experiment_id, name=version.model.name, tags=tags
    )
    client.log_model_artifacts(logged.model_id, str(path))
    client.finalize_logged_model(logged.model_id, "READY")
    return client.create_model_version(
        name,
        source=f"models:/{logged.model_id}",
        model_id=logged.model_id,
        tags=tags,
        description=version.description[:500],
    )


def _sync_mlflow_alias(model: RegisteredModel, alias: str, version: ModelVersion | None) -> None:
    try:
        client = mlflow_client()
        if version is None:
            client.delete_registered_model_alias(model.mlflow_name, alias)
        elif version.mlflow_version:
            client.set_registered_model_alias(model.mlflow_name, alias, version.mlflow_version)
    except Exception:
        log.exception("could not set MLflow alias %s of %s", alias, model)


def model_version_register(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    job: TrainingJob | None = None,
    bundle_path: str | Path | None = None,
    source: str = VersionSource.TRAINING,
    metrics: dict | None = None,
    evaluation: dict | None = None,
    importance: dict | None = None,
    description: str = "",
    mlflow_run_id: str = "",
    dataset: Dataset | None = None,
) -> ModelVersion:
    """Register the next version of model ``name`` from a job's bundle (or a platform path;
    both for a bundle made from a job's model, such as a quantised variant, whose lineage runs
    through the job)."""
    from training.bundle import BundleSpec

    if job is not None:
        if job.workspace_id != workspace.pk:
            raise ValidationError({"job": "no such training job in this workspace"})
        if not job.model_path and bundle_path is None:
            raise ConflictError(f"training job '{job.name}' has no model yet", attr="job")
        dataset = dataset or job.dataset
        metrics = metrics if metrics is not None else dict(job.metrics or {})
        mlflow_run_id = mlflow_run_id or job.mlflow_run_id
    if bundle_path is not None:
        source_dir = (
            Path(bundle_path)
            if isinstance(bundle_path, Path)
            else artifacts.resolve_artifact(str(bundle_path), attr="bundle_path")
        )
        source_dir = artifacts.platform_path(str(source_dir))
    elif job is not None:
        source_dir = artifacts.platform_path(job.model_path)
    else:
        raise ValidationError({"job": "give a training job or a bundle"})
    artifacts.check_bundle_dir(source_dir, attr="bundle_path")
    try:
        spec = BundleSpec.from_json(json.loads((source_dir / "spec.json").read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError({"bundle_path": f"bad bundle spec: {exc}"}) from exc
    metrics = dict(metrics or {})
    evaluation = dict(evaluation or metrics.get("evaluation") or {})
    importance = dict(importance or metrics.get("importance") or {})

    # The files go to a staging folder first, outside any lock; the version number is reserved
    # under the model's row lock, and only then does the folder take its final name. A folder
    # already at that name has no version row (its number is free under the lock): it is what a
    # crashed registration left, and it is replaced.
    staging = artifacts.resolve_artifact(
        f"{workspace.pk}/models/{name}/.staging-{uuid.uuid4().hex}"
    )
    files = artifacts.copy_bundle(source_dir, staging)
    # The MLmodel (mlflow.pyfunc.load_model opens the version) is one of its checksummed files.
    mlflow_models.write_pyfunc_mlmodel(staging, spec.to_json())
    mlmodel = staging / mlflow_models.MLMODEL
    files.append(
        {"name": mlmodel.name, "size": mlmodel.stat().st_size, "sha256": artifacts.sha256(mlmodel)}
    )
    target: Path | None = None
    try:
        with transaction.atomic():
            version, target = _register_locked(
                _Registration(
                    actor=actor,
                    workspace=workspace,
                    name=name,
                    files=files,
                    source=source,
                    job=job,
                    dataset=dataset,
                    spec=spec,
                    metrics=metrics,
                    evaluation=evaluation,
                    importance=importance,
                    mlflow_run_id=mlflow_run_id,
                    description=description,
                ),
                staging,
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if target is not None:
            shutil.rmtree(target, ignore_errors=True)
        raise
    _sync_mlflow(version)
    _sync_mlflow_alias(version.model, "candidate", version)
    return version


@dataclass(frozen=True)
class _Registration:
    """What one registration records, checked and read before the model's row lock is taken."""

    actor: Actor
    workspace: Workspace
    name: str
    files: list[dict]
    source: str
    job: TrainingJob | None
    dataset: Dataset | None
    spec: BundleSpec
    metrics: dict
    evaluation: dict
    importance: dict
    mlflow_run_id: str
    description: str


def _register_locked(reg: _Registration, staging: Path) -> tuple[ModelVersion, Path]:
    """Within the caller's transaction: lock the model, take the next number, move the staged
    files to their version folder and record the version."""
    workspace = reg.workspace
    model = _model_get_or_create(actor=reg.actor, workspace=workspace, name=reg.name)
    model = RegisteredModel.objects.for_workspace(workspace).select_for_update().get(pk=model.pk)
    latest = (
        ModelVersion.objects.for_workspace(workspace)
        .filter(model=model)
        .aggregate(latest=Max("version"))["latest"]
    )
    number = (latest or 0) + 1
    relative = version_dir(workspace, reg.name, number)
    target = artifacts.resolve_artifact(relative)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    try:
        return _record_version(reg, model=model, number=number, relative=relative), target
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # the transaction rolls back: no files either
        raise


def _record_version(
    reg: _Registration, *, model: RegisteredModel, number: int, relative: str
) -> ModelVersion:
    actor, workspace, name, job, dataset = reg.actor, reg.workspace, reg.name, reg.job, reg.dataset
    metrics, files = reg.metrics, reg.files
    try:
        with transaction.atomic():
            version = ModelVersion.objects.create(
                workspace=workspace,
                model=model,
                version=number,
                source=reg.source,
                job=job,
                dataset=dataset,
                artifact_path=relative,
                spec=reg.spec.to_json(),
                features=[f.ref for f in reg.spec.features],
                metrics=metrics,
                evaluation=reg.evaluation,
                importance=reg.importance,
                artifacts=files,
                mlflow_run_id=reg.mlflow_run_id or "",
                description=reg.description[:2000],
                created_by=actor_user(actor),
            )
    except IntegrityError as exc:
        raise ConflictError(f"model '{name}' v{number} was registered at the same moment") from exc
    check_loadable(version)
    refs = [Ref.to(version, role="output"), Ref.to(model, role="related")]
    if job is not None:
        refs.append(Ref.to(job, role="input"))
    if dataset is not None:
        refs.append(Ref(kind="dataset", object_id=dataset.pk, label=str(dataset), role="input"))
    storage_gb = sum(f["size"] for f in files) / 1e9
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.model_version.registered",
        refs=refs,
        resources={"storage_gb": storage_gb},
        payload={
            "model": name,
            "version": number,
            "source": reg.source,
            "features": version.features,
            "metrics": metrics,
            "artifact_path": relative,
        },
    )
    _register_consumers(actor=actor, version=version)
    model_alias_assign(actor=actor, model=model, alias="candidate", version=version, sync=False)
    from serving.benchmarks import benchmarks_request_for_version

    benchmarks_request_for_version(workspace=workspace, version=version)
    return version


def model_alias_assign(
    *,
    actor: Actor,
    model: RegisteredModel,
    alias: str,
    version: ModelVersion | None,
    sync: bool = True,
) -> None:
    """Point ``alias`` at ``version`` (``None`` drops it) and record the event, without the
    checks of ``model_alias_set``: for callers that chose the model and version themselves
    (registration, release, rollback)."""
    aliases = dict(model.aliases or {})
    if version is None:
        aliases.pop(alias, None)
    else:
        aliases[alias] = version.version
    RegisteredModel.objects.for_workspace(model.workspace_id).filter(pk=model.pk).update(
        aliases=aliases
    )
    model.aliases = aliases
    event_record(
        actor=actor,
        workspace=model.workspace,
        verb="serving.registered_model.alias_set",
        refs=[Ref.to(model), *([Ref.to(version, role="related")] if version else [])],
        payload={"alias": alias, "version": version.version if version else None},
    )
    if sync:
        transaction.on_commit(lambda: _sync_mlflow_alias_later(model, alias, version))


def _sync_mlflow_alias_later(
    model: RegisteredModel, alias: str, version: ModelVersion | None
) -> None:
    """Off the request path: a release or rollback must not wait for MLflow (its first client
    in a process costs seconds)."""
    if not settings.SERVING_MLFLOW_ASYNC:
        _sync_mlflow_alias(model, alias, version)
        return
    import threading

    threading.Thread(
        target=_sync_mlflow_alias, args=(model, alias, version), name="mlflow-alias", daemon=True
    ).start()


@transaction.atomic
def model_alias_set(
    *,
    actor: Actor,
    workspace: Workspace,
    model: RegisteredModel,
    alias: str,
    version: ModelVersion | None,
) -> None:
    """Point one of ``ALIASES`` at a version of ``model`` (``None`` drops it): 400 naming
    ``alias`` or ``version`` for one outside the list or a version of another model."""
    if alias not in ALIASES:
        raise ValidationError({"alias": f"use one of {', '.join(ALIASES)}"})
    if version is not None and version.model_id != model.pk:
        raise ValidationError({"version": "not a version of this model"})
    model_alias_assign(actor=actor, model=model, alias=alias, version=version)


# ---------------------------------------------------------------------------------------------
# Import from the stock MLflow client


# A source is imported only when it is proven to belong to the caller's workspace: training jobs
# log to the experiment ``rankops/<slug>``, the stock client (through the platform's /mlflow,
# training.mlflow_server) to it or to ``rankops/<slug>/<name>``; artifacts lie under
# ``MLFLOW_ARTIFACT_ROOT/<slug>``, runs may carry the tag ``rankops.workspace``, and the registry
# names models ``<slug>.<name>``. Anything else, including a run, model or path that does not
# exist, answers the same 404.
SOURCE_NOT_FOUND = "No such MLflow run, model or artifact directory in this workspace."
_RUN_ID = re.compile(r"[A-Za-z0-9][\w-]{0,255}")
_MODEL_URI = re.compile(r"(?P<name>[^/@]+)(?:/(?P<version>[0-9]+)|@(?P<alias>[A-Za-z0-9_-]+))/?")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _workspace_mlflow_root(workspace: Workspace) -> Path:
    return (Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug).resolve()


def _owned_dir(path: Path, roots: list[Path]) -> Path:
    """``path`` with every symlink resolved, when it is a directory inside one of ``roots``."""
    resolved = path.resolve()
    if not any(_inside(resolved, root) for root in roots) or not resolved.is_dir():
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    return resolved


def _workspace_experiment(workspace: Workspace, name: str) -> bool:
    """Its Default (``rankops/<slug>``) or a named experiment made through /mlflow."""
    home = f"rankops/{workspace.slug}"
    return name == home or name.startswith(home + "/")


def _owned_logged_model_dir(workspace: Workspace, model_id: str) -> Path:
    """The files of an MLflow 3 logged model (``models:/m-...``) in one of the workspace's
    experiments, inside its MLflow artifact folder."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client()
    try:
        logged = client.get_logged_model(model_id)
        experiment = client.get_experiment(logged.experiment_id)
    except MlflowException as exc:
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source") from exc
    location = urlsplit(logged.artifact_location or "")
    if not _workspace_experiment(workspace, experiment.name) or location.scheme not in (
        "file",
        "",
    ):
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    return _owned_dir(Path(unquote(location.path)), [_workspace_mlflow_root(workspace)])


def _owned_run(workspace: Workspace, run_id: str) -> Any:  # an mlflow.entities.Run
    """The MLflow run, when it lives in the workspace's experiment (and says so if it is tagged)."""
    from mlflow.exceptions import MlflowException

    if not _RUN_ID.fullmatch(run_id):
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    client = mlflow_client()
    try:
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id)
    except MlflowException as exc:  # a missing or malformed run id
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source") from exc
    tag = run.data.tags.get("rankops.workspace")
    if (
        not _workspace_experiment(workspace, experiment.name)
        or (tag is not None and tag != workspace.slug)
        or run.info.lifecycle_stage != "active"
    ):
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    return run


def _run_dir(workspace: Workspace, run: Any, path: str) -> Path:
    """A directory of the run's artifacts, inside the workspace's MLflow artifact folder (a run
    whose artifacts live anywhere else, a remote store included, cannot be proven ours)."""
    location = urlsplit(run.info.artifact_uri)
    if location.scheme not in ("file", "") or location.netloc not in ("", "localhost"):
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    base = Path(unquote(location.path))
    return _owned_dir(base / path if path else base, [_workspace_mlflow_root(workspace)])


def _owned_model_version_dir(workspace: Workspace, rest: str) -> tuple[Path, Any]:
    """``models:/<slug>.<name>/<version>`` or ``...@<alias>``: its files and its run (or None)."""
    if re.fullmatch(r"m-[0-9a-f]{8,64}/?", rest):  # MLflow 3's logged model, as log_model says
        model_id = rest.strip("/")
        folder = _owned_logged_model_dir(workspace, model_id)
        run_id = mlflow_client().get_logged_model(model_id).source_run_id
        return folder, _owned_run(workspace, run_id) if run_id else None
    match = _MODEL_URI.fullmatch(rest)
    if match is None:
        raise ValidationError(
            {"source": "use models:/<workspace>.<model>/<version> or .../<model>@<alias>"}
        )
    name = match["name"]
    slug, dot, _ = name.partition(".")
    if slug != workspace.slug or not dot:
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    from mlflow.exceptions import MlflowException

    client = mlflow_client()
    try:
        registered = client.get_registered_model(name)
        if match["version"] is not None:
            version = client.get_model_version(name, match["version"])
        else:
            version = client.get_model_version_by_alias(name, match["alias"])
    except MlflowException as exc:
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source") from exc
    tag = (registered.tags or {}).get("rankops.workspace")
    if tag is not None and tag != workspace.slug:
        raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")
    run = _owned_run(workspace, version.run_id) if version.run_id else None
    source = urlsplit(version.source or "")
    if source.scheme == "runs":
        run_id, _, path = f"{source.netloc}{source.path}".lstrip("/").partition("/")
        run = _owned_run(workspace, run_id)
        return _run_dir(workspace, run, path.strip("/")), run
    logged_model = f"{source.netloc}{source.path}".strip("/")
    if source.scheme == "models" and logged_model.startswith("m-"):
        # MLflow 3's log_model(registered_model_name=...) registers the logged model.
        return _owned_logged_model_dir(workspace, logged_model), run
    if source.scheme in ("file", "") and source.netloc in ("", "localhost") and source.path:
        # The platform registers its own versions from ARTIFACT_ROOT/<workspace id>/.
        roots = [
            _workspace_mlflow_root(workspace),
            (artifacts.artifact_root() / str(workspace.pk)).resolve(),
        ]
        return _owned_dir(Path(unquote(source.path)), roots), run
    raise ReferenceNotFound(SOURCE_NOT_FOUND, attr="source")


def _owned_source(workspace: Workspace, source: str) -> tuple[Path, Any]:
    """The local directory a source names and its MLflow run (or None), proven to belong to
    ``workspace``; 400 for a malformed source, 404 for one that cannot be proven ours."""
    scheme, rest = artifacts.check_source_uri(source)
    if scheme == "file":
        return _owned_dir(Path(rest), [_workspace_mlflow_root(workspace)]), None
    if scheme == "runs":
        run_id, _, path = rest.partition("/")
        run = _owned_run(workspace, run_id)
        return _run_dir(workspace, run, path.strip("/")), run
    return _owned_model_version_dir(workspace, rest)


def _find(root: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        for found in sorted(root.rglob(name)):
            if found.is_symlink() or not _inside(found.resolve(), root):
                raise ValidationError({"source": f"{found.name} is a symlink; refused"})
            if found.is_file():
                return found
    return None


def model_version_import_mlflow(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    source: str,
    description: str = "",
    inputs: Any = None,
    dataset: Dataset | None = None,
    architecture: dict | None = None,
    output: str = "probability",
) -> ModelVersion:
    """Import a model logged with the stock MLflow client.

    Accepted: a RankOps bundle spec (``spec.json``, e.g.
    ``mlflow.log_dict(spec, "model/spec.json")``)
    plus a state dict (``mlflow.pytorch.log_state_dict`` -> ``state_dict.pth``, or ``weights.pt``),
    loaded with ``weights_only=True``; for a ``lightgbm`` spec, LightGBM's text model
    (``model.txt``). Without a spec: a model of one of the safe flavors (``serving.flavors``:
    sklearn by skops, onnx, a LightGBM Booster, an XGBoost model (ubj or json), a pytorch
    state dict with its declared ``architecture``) with its ``inputs`` mapping (signature ->
    feature refs of ``dataset``, or plain names), see ``serving.mlflow_models``. A pickled model
    (the pytorch flavour's ``model.pth``, a cloudpickle pyfunc) cannot be loaded safely and is
    refused with 400 naming the safe flavors; it is never unpickled.
    """
    import torch

    from training.bundle import WEIGHTS_FILE, BundleSpec, build_model, model_file, save_bundle

    if dataset is not None and dataset.workspace_id != workspace.pk:
        raise ReferenceNotFound("No such dataset in this workspace.", attr="dataset")
    local, run = _owned_source(workspace, source)
    spec_file = _find(local, ("spec.json",))
    staging = (
        artifacts.artifact_root()
        / str(workspace.pk)
        / "imports"
        / next(tempfile._get_candidate_names())
    )

    def register_staged() -> ModelVersion:
        """The bundle staged under ``staging`` registered; the staging folder removed after."""
        try:
            return _register_import(
                actor=actor, workspace=workspace, name=name, staging=staging, run=run,
                source=source, description=description, dataset=dataset,
            )  # fmt: skip
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    if spec_file is None:
        try:
            mlflow_models.stage_flavor_bundle(
                workspace=workspace,
                local=local,
                staging=staging,
                inputs=inputs,
                dataset=dataset,
                architecture=architecture,
                output=output,
            )
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return register_staged()
    try:
        spec = BundleSpec.from_json(json.loads(spec_file.read_text()))
    except Exception as exc:
        raise ValidationError({"source": f"bad bundle spec: {str(exc)[:200]}"}) from exc
    own_file = model_file(spec.template)
    if own_file != WEIGHTS_FILE:  # e.g. lightgbm: its text model, logged with log_artifact
        weights = _find(local, (own_file,))
        missing = f"no {own_file} (a {spec.template} bundle's model)"
    else:
        weights = _find(local, ("state_dict.pth", "weights.pt"))
        missing = (
            "no state dict (state_dict.pth / weights.pt); pickled full models "
            "(model.pth, python_model.pkl) are refused"
        )
    if weights is None:
        raise ValidationError({"source": missing})
    try:
        model = build_model(spec)
        if own_file != WEIGHTS_FILE:
            model.load(weights)
        else:
            state = torch.load(weights, map_location="cpu", weights_only=True)
            model.load_state_dict(state)
    except ValidationError:
        raise
    except Exception as exc:
        raise ValidationError(
            {
                "source": f"model refused (only tensors-only state dicts are loaded): "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            }
        ) from exc
    save_bundle(staging, model, spec)
    return register_staged()


def _register_import(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    staging: Path,
    run: Any,
    source: str,
    description: str,
    dataset: Dataset | None,
) -> ModelVersion:
    metrics = dict(run.data.metrics) if run is not None else {}
    return model_version_register(
        actor=actor,
        workspace=workspace,
        name=name,
        bundle_path=staging,
        source=VersionSource.MLFLOW_IMPORT,
        metrics=metrics,
        description=description or f"Imported from {source}",
        mlflow_run_id=run.info.run_id if run is not None else "",
        dataset=dataset,
    )
