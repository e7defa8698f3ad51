"""Built-in PyTorch model templates, registered by name in ``training.bundle.TEMPLATES``."""

from training.templates import logreg  # noqa: F401
