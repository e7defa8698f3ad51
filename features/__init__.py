"""Feature management: registry, producer ingestion, offline and online stores, samples, health."""
