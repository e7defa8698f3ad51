"""Safe artifact handling: the only way serving turns a path or URL into something it reads.

Model artifacts are read only from the platform's artifact store (``ARTIFACT_ROOT``) at paths the
platform wrote, and only as a JSON spec plus a tensors-only state dict (``torch.load`` with
``weights_only=True``) or, for gradient-boosted trees, LightGBM's text model, so a pickle planted
as a model is refused, never executed. Anything that
names a path or a source is validated here first (see ``shared/docs/BAD-INPUTS.md``): fully
URL-decoded, then refused when it has ``..``, absolute parts, NUL bytes, backslashes, ``?#;``,
over-long names, Unicode look-alikes for ``/`` and ``.``, symlinks leading out of the root, or a
URL scheme/host outside the allow-list.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

from workspaces.outbound import OutboundRefused, public_addresses

# A torch bundle's files; a template with its own model file swaps the second (``bundle_files``).
BUNDLE_FILES = ("spec.json", "weights.pt")
FORBIDDEN_CHARS = set("\\?#;\x00")
# Look-alikes of '/' and '.' (fraction slash, division slash, full-width forms, one-dot leader...).
LOOKALIKES = set("\u2044\u2215\uff0f\u29f8\u2024\uff0e\u3002\ufe52\u0338\u2571")
ALLOWED_SOURCE_SCHEMES = {"runs", "models", "file"}


def artifact_root() -> Path:
    return Path(settings.ARTIFACT_ROOT).resolve()


def _decode_fully(text: str, attr: str) -> str:
    for _ in range(5):
        decoded = unquote(text)
        if decoded == text:
            return text
        text = decoded
    raise ValidationError({attr: "too many levels of URL encoding"})


def clean_relative_path(value: object, *, attr: str = "path") -> str:
    """A relative artifact path that is safe to join under a root, or ValidationError (400)."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError({attr: "give a relative artifact path"})
    text = _decode_fully(value, attr)
    if any(ch in FORBIDDEN_CHARS for ch in text):
        raise ValidationError({attr: "path contains a forbidden character (\\ ? # ; or NUL)"})
    if any(ch in LOOKALIKES for ch in text) or unicodedata.normalize("NFKC", text) != text:
        raise ValidationError({attr: "path contains Unicode look-alike characters"})
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise ValidationError({attr: "absolute paths are not allowed"})
    parts = text.split("/")
    for part in parts:
        if part in ("..", "."):
            raise ValidationError({attr: "'..' and '.' are not allowed in artifact paths"})
        if len(part.encode()) > 255:
            raise ValidationError({attr: "a path component is over 255 bytes"})
    if len(text) > 1000:
        raise ValidationError({attr: "path is too long"})
    return "/".join(p for p in parts if p)


def resolve_inside(root: Path, relative: str, *, attr: str = "path") -> Path:
    """``root/relative`` with every symlink resolved, refused unless it stays inside ``root``."""
    root = root.resolve()
    clean = clean_relative_path(relative, attr=attr)
    candidate = (root / clean).resolve()
    if candidate != root and root not in candidate.parents:
        raise ValidationError({attr: "path leads outside the artifact store"})
    return candidate


def resolve_artifact(path: str, *, attr: str = "path") -> Path:
    """A platform artifact path (relative to ARTIFACT_ROOT) resolved safely."""
    return resolve_inside(artifact_root(), path, attr=attr)


def platform_path(path: str) -> Path:
    """A path written by the platform itself (a job's ``model_path``): relative to ARTIFACT_ROOT
    or absolute inside it; anything else is refused."""
    root = artifact_root()
    if os.path.isabs(path):
        resolved = Path(path).resolve()
        if root not in resolved.parents:
            raise ValidationError({"model_path": "model path is outside the artifact store"})
        return resolved
    return resolve_artifact(path, attr="model_path")


def bundle_files(directory: Path, *, attr: str = "path") -> tuple[str, ...]:
    """The files of the bundle in ``directory``: ``spec.json`` and the model file its template
    keeps (``weights.pt``, or ``model.txt`` for ``lightgbm``: ``training.bundle.model_file``)."""
    from training.bundle import bundle_files as files_of

    spec = directory / BUNDLE_FILES[0]
    if spec.is_symlink():
        raise ValidationError({attr: f"{spec.name} is a symlink; refused"})
    if not spec.is_file():
        raise ValidationError({attr: f"bundle has no {spec.name}"})
    try:
        return files_of(directory)
    except (ValueError, OSError) as exc:
        raise ValidationError({attr: f"bad bundle spec: {str(exc)[:200]}"}) from exc


def check_bundle_dir(directory: Path, *, attr: str = "path") -> None:
    """A bundle directory holds regular files only (no symlinks), the spec and the model file
    (the weights)."""
    if directory.is_symlink() or not directory.is_dir():
        raise ValidationError({attr: "not a model bundle directory"})
    for name in bundle_files(directory, attr=attr):
        file = directory / name
        if file.is_symlink():
            raise ValidationError({attr: f"{name} is a symlink; refused"})
        if not file.is_file():
            raise ValidationError({attr: f"bundle has no {name}"})


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def copy_bundle(source: Path, target: Path) -> list[dict]:
    """Copy (hard-link when possible) a bundle's known files; returns the artifact list."""
    check_bundle_dir(source)
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for name in bundle_files(source):
        src, dst = source / name, target / name
        if dst.exists():
            dst.unlink()
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
        out.append({"name": name, "size": dst.stat().st_size, "sha256": sha256(dst)})
    return out


def check_source_uri(value: object, *, attr: str = "source") -> tuple[str, str]:
    """(scheme, rest) of an import source; only ``runs:/``, ``models:/`` and ``file://`` inside
    the MLflow artifact root are allowed. http(s), gopher, ftp, ... are refused (no remote
    fetches; a host that ``workspaces.outbound`` finds not public is named as such), as is any
    traversal."""
    if not isinstance(value, str) or not value.strip() or len(value) > 1000:
        raise ValidationError({attr: "give a source URI (runs:/<run_id>/<path> or models:/...)"})
    text = _decode_fully(value.strip(), attr)
    if "\x00" in text or "\\" in text:
        raise ValidationError({attr: "source contains a forbidden character"})
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        try:
            public_addresses(parts.hostname or "")
        except OutboundRefused:
            raise ValidationError(
                {attr: "sources on private, loopback or link-local hosts are refused"}
            ) from None
        raise ValidationError(
            {attr: "remote http(s) sources are not allowed; use runs:/ or models:/"}
        )
    if scheme == "":  # no colon at all, or a bare path
        raise ValidationError({attr: "give a runs:/, models:/ or file:// URI"})
    if scheme not in ALLOWED_SOURCE_SCHEMES:
        raise ValidationError({attr: f"scheme '{scheme}' is not allowed"})
    if parts.query or parts.fragment or ";" in text:
        raise ValidationError({attr: "source must not have a query, fragment or ';'"})
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValidationError({attr: "file URIs must be local"})
        root = Path(settings.MLFLOW_ARTIFACT_ROOT).resolve()
        resolved = Path(parts.path).resolve()
        if ".." in parts.path.split("/") or root not in resolved.parents:
            raise ValidationError({attr: "file sources must lie inside the MLflow artifact root"})
        return scheme, str(resolved)
    rest = text.split(":", 1)[1].lstrip("/")
    for piece in rest.split("/"):
        if piece in ("..", "."):
            raise ValidationError({attr: "'..' is not allowed in sources"})
    return scheme, rest
