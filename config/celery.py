"""The Celery app: the same settings module as the web process, tasks discovered per app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("rankops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
