"""Settings fragments of the experiments app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {
    # Snapshots, guardrails/SRM (stop and roll back) and the ramp schedule.
    "experiments-check-running": {
        "task": "experiments.tasks.check_running",
        "schedule": 60.0,
    },
}
ENUM_NAME_OVERRIDES: dict = {
    "ExperimentStateEnum": "experiments.models.ExperimentState",
    "ExperimentMetricEnum": "experiments.models.Metric",
    "ExperimentUnitEnum": "experiments.models.Unit",
}
TASK_ROUTES: dict = {}
