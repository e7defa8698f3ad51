"""Settings: embedded defaults, the production mode's refusals, and a clean `check --deploy`.

Each case runs manage.py in a fresh process, because settings are read once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRONG_KEY = "k3y-" + "x7Qp2mZr9LsVb4NcT8hW1yJdF6gKa0eU" * 2


def manage(*args: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    base = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "DJANGO_ENV"}
    }
    base["RANKOPS_VAR_DIR"] = str(tmp_path / "var")
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_production_without_secret_key_refuses_to_start(tmp_path):
    result = manage("check", env={"DJANGO_ENV": "production"}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "needs SECRET_KEY" in result.stderr


def test_production_with_debug_on_refuses_to_start(tmp_path):
    env = {"DJANGO_ENV": "production", "SECRET_KEY": STRONG_KEY, "DEBUG": "1"}
    result = manage("check", env=env, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "DEBUG" in result.stderr


def test_production_with_weak_secret_key_refuses_to_start(tmp_path):
    env = {"DJANGO_ENV": "production", "SECRET_KEY": "short", "ALLOWED_HOSTS": "x.example"}
    result = manage("check", env=env, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "too weak" in result.stderr


def test_production_check_deploy_reports_nothing(tmp_path):
    env = {
        "DJANGO_ENV": "production",
        "SECRET_KEY": STRONG_KEY,
        "ALLOWED_HOSTS": "rankops.example.com",
    }
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=env, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)" in result.stdout


def test_embedded_defaults_need_no_servers(tmp_path):
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, "
        "s.CACHES['default']['BACKEND'], s.MLFLOW_TRACKING_URI, s.ARTIFACT_ROOT)",
        env={},
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    engine, broker, cache, mlflow_uri, artifacts = result.stdout.splitlines()[-1].split()
    assert engine == "django.db.backends.sqlite3"
    assert broker == "embedded://"
    assert cache.endswith("FileBasedCache")
    assert mlflow_uri.startswith("sqlite:///") and mlflow_uri.endswith("/mlflow/mlflow.db")
    assert artifacts.startswith(str(tmp_path))


def test_service_urls_switch_to_real_services(tmp_path):
    env = {
        "DATABASE_URL": "postgres://u:p@db.internal:5432/rankops",
        "REDIS_URL": "redis://cache.internal:6379/0",
        "ARTIFACT_ROOT": "s3://bucket/artifacts",
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
    }
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings as s; d = s.DATABASES['default']; "
        "print(d['ENGINE'], d['HOST'], s.CELERY_BROKER_URL, s.CACHES['default']['BACKEND'], "
        "s.ARTIFACT_ROOT, s.MLFLOW_TRACKING_URI)",
        env=env,
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == [
        "django.db.backends.postgresql",
        "db.internal",
        "redis://cache.internal:6379/0",
        "django.core.cache.backends.redis.RedisCache",
        "s3://bucket/artifacts",
        "http://mlflow.internal:5000",
    ]


@pytest.mark.parametrize("module", ["uuid", "platform"])
def test_repo_root_does_not_shadow_the_standard_library(module):
    assert not (ROOT / "platform" / "__init__.py").exists()
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}; print({module}.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert str(ROOT) not in result.stdout
