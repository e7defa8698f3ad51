"""Settings fragments of the serving app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {
    "serving-predlog-flush": {"task": "serving.predlog_flush", "schedule": 2.0},
    "serving-deployments-reconcile": {"task": "serving.deployments_reconcile", "schedule": 30.0},
}
ENUM_NAME_OVERRIDES: dict = {}
TASK_ROUTES: dict = {}
