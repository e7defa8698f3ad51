from django.apps import AppConfig


class FeaturesConfig(AppConfig):
    name = "features"
    verbose_name = "Features"

    def ready(self) -> None:
        from features.views import dashboard_section
        from workspaces.dashboard import register_section

        register_section("features", dashboard_section)

        from workspaces.demo import register_demo_step

        register_demo_step(10, "features", _demo_features)

        from features.models import Feature, FeatureGroup, FeatureGroupVersion
        from workspaces.signals import connect_access_invalidation

        # Online lookups cache the registry per process; any registry write invalidates it.
        connect_access_invalidation(FeatureGroup, FeatureGroupVersion, Feature)

        from features import materialization
        from workspaces import outbox

        # A batch the push could not write online is written by this consumer of the log.
        outbox.consumer_register(
            materialization.CONSUMER,
            materialization.batch_materialize_event,
            verbs=["feature_batch.ingested"],
        )


def _demo_features(base_url: str, stdout) -> None:
    from django.core.management import call_command

    call_command("demo_features", base_url=base_url, stdout=stdout)
