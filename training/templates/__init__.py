"""Built-in PyTorch model templates, registered by name in ``training.bundle.TEMPLATES``.

Each builder takes a ``BundleSpec`` and returns a module whose ``forward(dense, cat)`` gives one
logit per row. A module may define ``training_loss(dense, cat, label)`` (the two-tower model's
in-batch negatives); otherwise the runner uses binary cross-entropy on the logits.
"""

from training.templates import deepfm, fine_ranking, logreg, two_tower  # noqa: F401

# Template name -> one line shown in the API and the UI.
DESCRIPTIONS = {
    "logreg": "Logistic regression (linear baseline)",
    "fine_ranking": "Fine ranking CTR model (DCN-v2: embeddings, cross layers, MLP)",
    "two_tower": "Recall two-tower model (user and item towers, in-batch negatives)",
    "deepfm": (
        "DeepFM: explicit 2nd-order feature interactions plus a deep part; "
        "a strong CTR baseline on sparse categorical fields"
    ),
}
