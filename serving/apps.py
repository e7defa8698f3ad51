"""Serving: model registry, release gates, deployments, the inference gateway and rollback."""

from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving"

    def ready(self) -> None:
        from serving import demo, flavors, pipeline  # noqa: F401  (flavors: imported templates)
        from workspaces.demo import register_demo_step

        register_demo_step(30, "serving", demo.run_serving_demo)

        from serving.dashboard import dashboard_section
        from workspaces.dashboard import register_section

        register_section("models", dashboard_section)
        # Training offers plugin registries for pipeline stages and the production-model
        # resolver; they may not exist yet while training is being built.
        try:
            from training import pipelines
        except ImportError:
            pipelines = None
        if pipelines is not None and callable(getattr(pipelines, "register_stage", None)):
            pipelines.register_stage("register", pipeline.register_stage)
            pipelines.register_stage("deploy", pipeline.deploy_stage)
            pipelines.register_stage("quality_gate", pipeline.quality_gate_stage)
            pipelines.register_stage("release_gates", pipeline.release_gates_stage)
            pipelines.register_stage("challenger", pipeline.challenger_stage)
        from training.services import register_model_registrar

        register_model_registrar(pipeline.register_tuning_best)
        try:
            from training import evaluation
        except ImportError:
            evaluation = None
        resolver_hook = getattr(evaluation, "register_production_model_resolver", None)
        if callable(resolver_hook):
            resolver_hook(pipeline.production_model_resolver)
