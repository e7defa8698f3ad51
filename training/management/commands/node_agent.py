"""``manage.py node_agent --name gpu-1``: run this machine as a training node.

It starts a Celery worker on the queue ``node.<name>``; the worker registers the node (inventory
by heartbeat) and runs the jobs the scheduler places here as child processes.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.agent import NODE_QUEUE_PREFIX
from training.models import node_name_validator


class Command(BaseCommand):
    help = "Run a node agent: a Celery worker on queue node.<name> with a heartbeat."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, help="Node name (lowercase, digits, . -)")
        parser.add_argument("--slots", type=int, default=4, help="Jobs run at the same time.")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, name: str, slots: int, loglevel: str, **options) -> None:
        from django.core.exceptions import ValidationError

        from config.celery import app

        try:
            node_name_validator(name)
        except ValidationError as exc:
            raise CommandError(f"--name: {exc.messages[0]}") from exc
        queue = f"{NODE_QUEUE_PREFIX}{name}"
        self.stdout.write(f"node agent {name}: consuming {queue}")
        app.worker_main(
            argv=[
                "worker",
                "--queues",
                queue,
                "--hostname",
                f"{name}@%h",
                "--pool",
                "threads",
                "--concurrency",
                str(max(1, slots)),
                "--loglevel",
                loglevel,
            ]
        )
