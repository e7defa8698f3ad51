"""The feature app's writes as other apps call them: registering groups and consumers, pushing
batches, building datasets and sample streams. Each lives beside its own machinery (the registry,
ingestion, point-in-time samples); this module is the surface the other apps import."""

from __future__ import annotations

from features.ingestion import batch_ingest as batch_ingest
from features.registry import consumer_register as consumer_register
from features.registry import feature_group_register as feature_group_register
from features.samples import dataset_create as dataset_create
from features.samples import sample_stream_add_feature as sample_stream_add_feature
