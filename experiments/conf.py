"""Settings fragments of the experiments app, merged by config/settings.py.

Keep this module free of Django imports: settings import it.
"""

BEAT_SCHEDULE: dict = {}
ENUM_NAME_OVERRIDES: dict = {}
TASK_ROUTES: dict = {}
