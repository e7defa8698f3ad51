"""Serving's writes and checks for the other apps: releases, the gates a version must pass,
an experiment's traffic split and the prediction log.

The names are serving's own (``serving.deployments``, ``gates``, ``quality``, ``routing``,
``predlog``); this module is where other apps take them from (the public-surface contract in
``pyproject.toml``). It imports those modules when first imported, so the apps that call it
import it where they call it, as they imported the modules before.
"""

from __future__ import annotations

from serving.deployments import deployment_release as deployment_release
from serving.gates import require_deployable as require_deployable
from serving.predlog import predlog_flush as predlog_flush
from serving.predlog import predlog_write as predlog_write
from serving.quality import require_quality as require_quality
from serving.routing import routing_experiment_clear as routing_experiment_clear
from serving.routing import routing_experiment_set as routing_experiment_set
