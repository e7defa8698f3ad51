"""Serving: model registry, release gates, deployments, the inference gateway and rollback."""
