"""The Celery app: the same settings module as the web process, tasks discovered per app."""

import os

from celery import Celery
from celery.signals import task_postrun

from config.broker import register as register_embedded_broker
from config.quiet_ticks import log_tick_work

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
register_embedded_broker()  # `embedded://`, the broker without REDIS_URL

app = Celery("rankops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Ticks whose INFO lines LOGGING drops say so themselves when they did something.
task_postrun.connect(log_tick_work, weak=False)
