"""Browser UI routes of the training app, under /w/<ws>/training/."""

from django.urls import path

from training import notebook_views, tuning_views, views

urlpatterns = [
    path("w/<slug:ws>/training/", views.job_list, name="training-jobs"),
    path("w/<slug:ws>/training/jobs/new/", views.job_new, name="training-job-new"),
    path(
        "w/<slug:ws>/training/jobs/new/params/",
        views.job_new_params,
        name="training-job-new-params",
    ),
    path("w/<slug:ws>/training/jobs.json", views.job_list_json, name="training-jobs-json"),
    path("w/<slug:ws>/training/jobs/<int:pk>/", views.job_page, name="training-job"),
    path(
        "w/<slug:ws>/training/jobs/<int:pk>/live.json",
        views.job_live_json,
        name="training-job-live",
    ),
    path("w/<slug:ws>/training/tuning/", tuning_views.tuning_list, name="training-tuning"),
    path("w/<slug:ws>/training/tuning/new/", tuning_views.tuning_new, name="training-tuning-new"),
    path(
        "w/<slug:ws>/training/tuning/<int:pk>/",
        tuning_views.tuning_page,
        name="training-tuning-job",
    ),
    path(
        "w/<slug:ws>/training/tuning/<int:pk>/cancel/",
        tuning_views.tuning_cancel,
        name="training-tuning-cancel",
    ),
    path("w/<slug:ws>/notebook/", notebook_views.notebook_page, name="training-notebook"),
    path("w/<slug:ws>/notebook/open/", notebook_views.notebook_open, name="training-notebook-open"),
    path(
        "w/<slug:ws>/notebook/<int:pk>/stop/",
        notebook_views.notebook_stop,
        name="training-notebook-stop",
    ),
    path("w/<slug:ws>/training/pipelines/", views.pipeline_list, name="training-pipelines"),
    path("w/<slug:ws>/training/pipelines/new/", views.pipeline_new, name="training-pipeline-new"),
    path(
        "w/<slug:ws>/training/pipelines/runs/new/",
        views.pipeline_run_new,
        name="training-pipeline-run-new",
    ),
    path(
        "w/<slug:ws>/training/pipelines/runs/<int:pk>/retry/",
        views.pipeline_run_retry,
        name="training-pipeline-run-retry",
    ),
    path(
        "w/<slug:ws>/training/pipelines/runs.json",
        views.pipeline_runs_json,
        name="training-pipeline-runs-json",
    ),
]
