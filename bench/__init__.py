"""Benchmarks of the platform, one module per area under ``bench/areas/`` (see bench/README.md)."""
