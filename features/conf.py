"""Settings fragments of the features app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {}
ENUM_NAME_OVERRIDES: dict = {"BatchFormatEnum": "features.models.BatchFormat"}
TASK_ROUTES: dict = {}
