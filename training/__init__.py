"""Training: jobs, pipelines, the scheduler, node agents, templates, tracking and evaluation."""
