"""Scheduler state beyond the job row (see training.models for Node and TrainingJob)."""
