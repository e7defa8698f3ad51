from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self) -> None:
        import training.pipelines  # noqa: F401  (registers the built-in stage kinds)
        from training.demo import run_training_demo
        from workspaces.demo import register_demo_step

        register_demo_step(20, "training", run_training_demo)

        from training.views import dashboard_section
        from workspaces.dashboard import register_section

        register_section("jobs", dashboard_section)

        from features.panels import register_group_panel
        from training.feature_panels import feature_importance_panel

        register_group_panel("training.importance", feature_importance_panel)
