"""Top-level routes: the browser UI, the admin console, the REST API and its schema, probes,
and MLflow's tracking server under ``/mlflow``."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from serving.gateway import oip_server
from training import mlflow_server
from workspaces import health

api_v1 = [
    path("", include("workspaces.api.urls")),
    path("", include("features.api.urls")),
    path("", include("curation.api.urls")),
    path("", include("training.api.urls")),
    path("", include("serving.api.urls")),
    path("", include("experiments.api.urls")),
    path("", include("lineage.api.urls")),
    path("", include("training.scheduler.api.urls")),
]

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include((api_v1, "api"), namespace="v1")),
    path("v2", oip_server, name="oip-server-root"),  # GET /v2 as the protocol spells it
    path("v2/", include("serving.oip_urls")),
    # MLflow's tracking server (its own Flask app) behind the platform's tokens and workspaces.
    re_path(
        r"^mlflow/w/(?P<slug>[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)(?P<rest>/.*)?$",
        mlflow_server.mlflow_endpoint,
        name="mlflow-workspace",
    ),
    re_path(r"^mlflow(?P<rest>/.*)?$", mlflow_server.mlflow_endpoint, name="mlflow"),
    path("", include("features.urls")),
    path("", include("curation.urls")),
    path("", include("training.urls")),
    path("", include("serving.urls")),
    path("", include("experiments.urls")),
    path("", include("lineage.urls")),
    path("", include("workspaces.urls")),
    path("", include("training.scheduler.urls")),
]
