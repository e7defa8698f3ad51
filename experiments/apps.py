"""A/B experiments: assignment, ramp, analysis, guardrails and promotion."""

from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "experiments"
    verbose_name = "Experiments"

    def ready(self) -> None:
        from experiments.views import dashboard_section
        from workspaces.dashboard import register_section
        from workspaces.demo import register_demo_step

        register_section("experiments", dashboard_section)

        # The loop's last stage: a pipeline like any other (training never imports us).
        from experiments.loop import experiment_stage
        from training.pipelines import register_stage

        register_stage("experiment", experiment_stage)

        register_demo_step(40, "experiments", _demo_experiments)


def _demo_experiments(base_url: str, stdout) -> None:
    from experiments.demo import run_demo

    run_demo(base_url=base_url, stdout=stdout)
