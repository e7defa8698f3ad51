"""A/B experiments: assignment, ramp, analysis, guardrails and promotion."""
