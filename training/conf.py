"""Settings fragments of the training app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {
    # The scheduler (training.scheduler): ticks between submissions, and the reconciler.
    "scheduler-tick": {"task": "training.scheduler.tasks.tick", "schedule": 5.0},
    "scheduler-reconcile": {"task": "training.scheduler.tasks.reconcile", "schedule": 10.0},
    # Pipeline runs whose wake-up was lost (their lease lapsed): queued again.
    "pipeline-resume": {"task": "training.tasks.resume_pipelines", "schedule": 60.0},
    # Tuning jobs advance when a trial ends or reaches an epoch; this sweep catches lost wake-ups.
    "tuning-advance": {"task": "training.tasks.advance_tuning_jobs", "schedule": 20.0},
}
# Import paths (resolved lazily by drf-spectacular), so this module stays free of Django imports.
ENUM_NAME_OVERRIDES: dict = {
    "TrainingJobStateEnum": "training.models.JobState",
    "PipelineRunStateEnum": "training.models.RunState",
    "EntryPointKindEnum": "training.models.EntryPointKind",
    "TuningJobStateEnum": "training.models.TuningState",
    "TuningTrialStateEnum": "training.models.TrialState",
}
TASK_ROUTES: dict = {}
