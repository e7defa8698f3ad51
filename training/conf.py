"""Settings fragments of the training app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {
    # The scheduler (training.scheduler): ticks between submissions, and the reconciler.
    "scheduler-tick": {"task": "training.scheduler.tasks.tick", "schedule": 5.0},
    "scheduler-reconcile": {"task": "training.scheduler.tasks.reconcile", "schedule": 10.0},
    # Pipeline runs whose wake-up was lost (their lease lapsed): queued again.
    "pipeline-resume": {"task": "training.tasks.resume_pipelines", "schedule": 60.0},
}
# Import paths (resolved lazily by drf-spectacular), so this module stays free of Django imports.
ENUM_NAME_OVERRIDES: dict = {
    "TrainingJobStateEnum": "training.models.JobState",
    "PipelineRunStateEnum": "training.models.RunState",
    "EntryPointKindEnum": "training.models.EntryPointKind",
}
TASK_ROUTES: dict = {}
