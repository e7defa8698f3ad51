from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    """The scheduler: admission, placement, preemption, failover, lending, recommendation.

    A Django app of its own (label ``scheduler``) inside ``training/`` so that its models and
    migrations evolve independently of the job models it schedules.
    """

    name = "training.scheduler"
    label = "scheduler"
    verbose_name = "Scheduler"

    def ready(self) -> None:
        from training.scheduler.selectors import workspaces_usage_now
        from training.scheduler.views import dashboard_section
        from workspaces.dashboard import register_section
        from workspaces.quota import register_usage_provider

        register_section("quota", dashboard_section)
        register_usage_provider(workspaces_usage_now)
