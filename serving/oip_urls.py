"""Open Inference Protocol routes (/v2/...), served at the site root.

Model names are workspace-qualified: ``<workspace-slug>.<deployment>``.
"""

from django.urls import path

from serving import gateway

urlpatterns: list = [
    path("health/live", gateway.oip_live, name="oip-live"),
    path("health/ready", gateway.oip_ready, name="oip-ready"),
    path("models/<str:name>", gateway.oip_model, name="oip-model"),
    path("models/<str:name>/ready", gateway.oip_model_ready, name="oip-model-ready"),
    path("models/<str:name>/infer", gateway.oip_infer, name="oip-infer"),
    path("models/<str:name>/versions/<str:version>", gateway.oip_model, name="oip-model-version"),
    path(
        "models/<str:name>/versions/<str:version>/ready",
        gateway.oip_model_ready,
        name="oip-model-version-ready",
    ),
    path(
        "models/<str:name>/versions/<str:version>/infer",
        gateway.oip_infer,
        name="oip-infer-version",
    ),
]
