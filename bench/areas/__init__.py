"""Benchmark areas: each module here has a docstring and ``run(ctx) -> dict[str, float]``."""
