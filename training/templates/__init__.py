"""Built-in model templates, registered by name in ``training.bundle.TEMPLATES``.

Each builder takes a ``BundleSpec`` and returns a model whose ``forward(dense, cat)`` gives one
logit per row. The neural templates are PyTorch modules trained by the runner's torch loop; a
module may define ``training_loss(dense, cat, label)`` (the two-tower model's in-batch
negatives), otherwise the runner uses binary cross-entropy on the logits. ``lightgbm`` is
gradient-boosted trees, trained by ``training.gbdt`` and stored as LightGBM's text model.

Which to pick: ``lightgbm`` first on a new tabular dataset (the baseline to beat), ``logreg``
as the sanity floor, ``fine_ranking`` or ``deepfm`` when many categorical fields interact and
there are enough rows for embeddings, ``two_tower`` for recall (user and item vectors).
"""

# Registers each template's params and builder; the networks (and torch) load on the first build.
from training.templates import schemas  # noqa: F401

# Template name -> one line shown in the API and the UI: what it is and when to pick it.
DESCRIPTIONS = {
    "logreg": (
        "Logistic regression (linear baseline): the sanity floor every other model must beat; "
        "pick it to check a dataset and its features quickly"
    ),
    "fine_ranking": (
        "Fine ranking CTR model (DCN-v2: embeddings, cross layers, MLP): the platform's default "
        "ranker; pick it for many categorical fields with enough rows to learn embeddings"
    ),
    "two_tower": (
        "Recall two-tower model (user and item towers, in-batch negatives): pick it for "
        "candidate retrieval, where users and items are scored by a dot product"
    ),
    "deepfm": (
        "DeepFM: explicit 2nd-order feature interactions plus a deep part; "
        "a strong CTR baseline on sparse categorical fields; pick it when pairwise field "
        "interactions (user x ad) carry the signal"
    ),
    "lightgbm": (
        "LightGBM gradient-boosted trees: the strong tabular baseline; pick it first on a new "
        "dataset (dense and categorical fields, no embeddings to learn). Trained by boosting "
        "rounds: the torch params (epochs, lr, batch_size...) do not apply"
    ),
    "lm_lora": (
        "LoRA fine-tuning of a local causal language model (peft) on a record set of "
        "instruction rows or chat messages: pick it to adapt a small LLM to your data; give "
        "base_model_path, and an lr near 1e-4 to 1e-3 and a batch_size near 8 to 64"
    ),
    "lm_full": (
        "Full fine-tuning of a local causal language model (every weight trains) on a record "
        "set of instruction rows or chat messages: pick it for a small model, or when LoRA's "
        "low-rank update cannot fit your data; it costs about 16 bytes of memory a parameter "
        "(float32 weights, gradients and AdamW state: some 8 GB for a 0.5B model, before "
        "activations) against LoRA's few, and saves the whole model, loadable on its own; "
        "give base_model_path, and an lr near 1e-5 to 1e-4"
    ),
}
