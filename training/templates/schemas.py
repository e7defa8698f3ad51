"""Each built-in template's declared params and its registration, without importing torch.

The API (``templates/``, the training and tuning forms, the job serializer's validation) reads a
template's params from ``training.bundle.TEMPLATE_PARAMS``; only training and serving need the
networks. So the params live here, in a module that imports no torch, and each template is
registered by the path of its builder (``training.bundle.declare_template``), which imports the
network module on the first build. Measured before this split: every web and worker start
imported torch through ``training.api.views`` -> ``training.templates`` (about 1.8 s of a 3.6 s
Django and Celery start on an idle 2-core machine, more under load), and a restarted worker
consumes that much later.

Each template's module (``training.templates.<name>``) holds its network and says what its
params do to it; ``DESCRIPTIONS`` in ``training.templates`` says what each one is for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from training.bundle import LM_ADAPTER_FILE, LM_FULL_MODEL_FILE, declare_template
from training.params import COMMON, Param

# The templates that train an average of networks declare this param (``training.bundle.
# build_model`` builds the members, ``Averaged`` trains and averages them).
MEMBERS = Param(
    "int",
    1,
    "Networks trained one after another, each as a run of its own with the seed, seed + 1, "
    "... (its initialisation, batch order and early-stopping epoch); the model's logit is "
    "their mean, and the calibration is fitted on that mean. Averaging removes most of the "
    "spread between seeds: on the quality bench (MovieLens 100K, time-ordered split) three "
    "DCN-v2 runs averaged gained 0.004 AUC and 0.005 log loss over one, at three times the "
    "training and serving cost.",
    min=1,
    max=16,
    label="Averaged networks",
)

# The templates that can be cross-fitted declare this param (``training.runner.train_members``
# trains the folds' models, ``Averaged`` averages them, as it does ``members``).
CV_FOLDS = Param(
    "int",
    0,
    "k-fold cross-fitting for small datasets (0 or 1: off). The train and validation rows "
    "are pooled and dealt into k folds (interleaved in time order); k models are trained, "
    "model i never on fold i: on the k - 1 other folds, or, where it stops early, on k - 2 "
    "of them, early-stopped on fold i + 1; the model's logit is their mean. The validation "
    "metrics (and the calibration, and what the tuner compares) are out of fold: every "
    "pooled row scored by the model that neither trained nor stopped on it, so they rest on "
    "all those rows instead of the validation split alone. The encoding is "
    "fitted on the pooled rows (labels unread). The test rows stay out. Not with members "
    "> 1 (the folds' models are the members). k times the training and serving cost.",
    min=0,
    max=20,
    label="Cross-validation folds",
)

# logreg (``training.templates.logreg``)
SOLVERS = ("lbfgs", "adam")

LOGREG_PARAMS: dict[str, Param] = {
    "solver": Param(
        "choice",
        "lbfgs",
        "lbfgs: the convex fit to convergence on all training rows (as scikit-learn's "
        "LogisticRegression; lr, batch_size, epochs and early stopping are not used); adam: "
        "minibatch steps with early stopping, as the deep templates train.",
        choices=SOLVERS,
    ),
    "l2": Param(
        "float",
        1e-4,
        "L2 penalty of the convex fit per training row (l2 = 1 / (C * rows) in scikit-learn's "
        "terms); the bias is not penalised.",
        min=0.0,
        max=100.0,
        label="L2 penalty",
    ),
    "max_iter": Param(
        "int",
        200,
        "Most L-BFGS iterations of the convex fit.",
        min=1,
        max=10_000,
        label="Most iterations",
        advanced=True,
    ),
    "cv_folds": CV_FOLDS,
}

# fine_ranking (``training.templates.fine_ranking``)
FINE_RANKING_PARAMS: dict[str, Param] = {
    "embedding_dim": Param(
        "int", 8, "Width of each categorical feature's embedding.", min=1, max=512
    ),
    "cross_layers": Param(
        "int", 2, "Full-rank cross layers (explicit interactions).", min=0, max=8
    ),
    "hidden": Param(
        "int_list",
        [64, 32],
        "Widths of the MLP's hidden layers, e.g. 64,32.",
        min=1,
        max=4096,
        label="Hidden layers",
    ),
    "dropout": Param("float", 0.0, "Dropout after each MLP layer.", min=0.0, max=0.9),
    "members": MEMBERS,
    "cv_folds": CV_FOLDS,
}

# deepfm (``training.templates.deepfm``)
DEEPFM_PARAMS: dict[str, Param] = {
    "embedding_dim": Param(
        "int",
        10,
        "Width of every field's embedding (shared by the FM and the DNN).",
        min=1,
        max=512,
    ),
    "hidden": Param(
        "int_list",
        [128, 64],
        "Widths of the DNN's hidden layers, e.g. 128,64 (the paper: 400,400,400).",
        min=1,
        max=4096,
        label="Hidden layers",
    ),
    "dropout": Param("float", 0.0, "Dropout after each DNN layer.", min=0.0, max=0.9),
    "batch_norm": Param(
        "bool", False, "Batch normalisation before each DNN activation.", label="Batch norm"
    ),
    "embedding_l2": Param(
        "float",
        0.0,
        "L2 penalty on the embedding tables, added to the loss (DeepCTR uses 1e-5).",
        min=0.0,
        max=1.0,
        label="Embedding L2",
        advanced=True,
    ),
    "members": MEMBERS,
    "cv_folds": CV_FOLDS,
}

# two_tower (``training.templates.two_tower``)
TWO_TOWER_PARAMS: dict[str, Param] = {
    "embedding_dim": Param(
        "int", 8, "Width of each categorical feature's embedding.", min=1, max=512
    ),
    "tower_dim": Param("int", 32, "Width of the user and item vectors.", min=1, max=1024),
    "hidden": Param("int", 64, "Width of each tower's hidden layer.", min=1, max=4096),
    "temperature": Param(
        "float", 0.1, "Divides the dot product (lower: sharper scores).", min=0.001, max=10.0
    ),
}

# lightgbm (``training.templates.lightgbm``)
LIGHTGBM_PARAMS: dict[str, Param] = {
    "num_boost_round": Param(
        "int",
        1000,
        "Boosting rounds (trees) at most; early stopping usually ends sooner.",
        min=1,
        max=100_000,
        label="Boosting rounds",
    ),
    "learning_rate": Param(
        "float",
        0.05,
        "Shrinkage of each tree's contribution (lower: more rounds, often better).",
        min=0.0001,
        max=1.0,
    ),
    "num_leaves": Param(
        "int", 31, "Leaves per tree at most (the main capacity knob).", min=2, max=131_072
    ),
    "min_data_in_leaf": Param(
        "int",
        20,
        "Training rows a leaf needs at least (higher: smoother, less overfitting).",
        min=1,
        max=1_000_000,
        label="Min rows in a leaf",
    ),
    "feature_fraction": Param(
        "float",
        0.9,
        "Share of the columns each tree may use (sampled per tree).",
        min=0.01,
        max=1.0,
    ),
    "bagging_fraction": Param(
        "float",
        1.0,
        "Share of the training rows each bagging draw keeps (with bagging_freq > 0).",
        min=0.01,
        max=1.0,
    ),
    "bagging_freq": Param(
        "int",
        0,
        "Draw a new bag every N rounds (0: no bagging).",
        min=0,
        max=10_000,
        label="Bagging frequency",
    ),
    "lambda_l1": Param(
        "float", 0.0, "L1 penalty on the leaf values.", min=0.0, max=1000.0, label="L1 penalty"
    ),
    "lambda_l2": Param(
        "float", 0.0, "L2 penalty on the leaf values.", min=0.0, max=1000.0, label="L2 penalty"
    ),
    "max_bin": Param(
        "int",
        255,
        "Histogram bins per numeric column.",
        min=2,
        max=65_535,
        advanced=True,
        label="Max bins",
    ),
    "early_stopping_rounds": Param(
        "int",
        50,
        "Stop after this many rounds without a better validation metric and keep the best "
        "round's trees (0: run every round and keep them all).",
        min=0,
        max=100_000,
    ),
    "categorical": Param(
        "bool",
        True,
        "Pass the categorical codes as LightGBM categorical features (false: as numbers).",
        label="Native categorical splits",
    ),
    "cv_folds": CV_FOLDS,
}


LIGHTGBM_MODEL_FILE = "model.txt"


# ``lm_lora``: LoRA fine-tuning of a local causal language model on a record set (instruction
# rows or chat ``messages``), trained by ``training.lm``. It reads these and, of ``COMMON``,
# epochs, max_steps, batch_size (rows per optimiser step), lr, weight_decay, seed,
# holdout_fraction, device, threads, log_every_steps, checkpoint_every_steps/_s, step_sleep_s.
LM_LORA_PARAMS: dict[str, Param] = {
    "base_model_path": Param(
        "str",
        "",
        "The base model: a folder on the training nodes in Hugging Face format (config, "
        "weights and tokenizer saved with save_pretrained), under one of the folders the "
        "platform allows (TRAINING_BASE_MODEL_ROOTS). Nothing is downloaded.",
        label="Base model folder",
    ),
    "lora_r": Param(
        "int", 8, "LoRA rank of each adapted weight.", min=1, max=1024, label="LoRA rank"
    ),
    "lora_alpha": Param(
        "int",
        16,
        "LoRA scaling (the update is scaled by alpha / r).",
        min=1,
        max=10_000,
        label="LoRA alpha",
    ),
    "lora_dropout": Param(
        "float", 0.05, "Dropout on the LoRA path's input.", min=0.0, max=0.9, label="LoRA dropout"
    ),
    "target_modules": Param(
        "str",
        "",
        "The modules to adapt, comma-separated (e.g. q_proj,v_proj; blank: peft's default "
        "for the architecture).",
        advanced=True,
    ),
    "max_length": Param(
        "int",
        512,
        "Tokens per example (longer ones are cut).",
        min=8,
        max=32_768,
        label="Longest sequence",
    ),
    "micro_batch_size": Param(
        "int",
        8,
        "Rows per forward pass; a step accumulates the gradients of batch_size rows.",
        min=1,
        max=4096,
        advanced=True,
    ),
}


# ``lm_full``: full fine-tuning of a local causal language model on a record set (every weight
# trains), trained by ``training.lm`` with the same data, loss, checkpoints and events as
# ``lm_lora``. Its own params are lm_lora's less the LoRA ones, and ``gradient_checkpointing``;
# it gives ``lr`` and ``batch_size`` defaults of its own (a whole model's weights take far
# smaller steps than LoRA's), the shared params' types and bounds unchanged.
LM_FULL_PARAMS: dict[str, Param] = {
    "base_model_path": LM_LORA_PARAMS["base_model_path"],
    "lr": replace(
        COMMON["lr"],
        default=5e-5,
        help="AdamW learning rate over all of the model's weights: near 1e-5 to 1e-4 for a "
        "pretrained model (larger steps overwrite what it knew); a tiny model trained from "
        "random weights takes more.",
    ),
    "batch_size": replace(COMMON["batch_size"], default=16),
    "max_length": LM_LORA_PARAMS["max_length"],
    "micro_batch_size": LM_LORA_PARAMS["micro_batch_size"],
    "gradient_checkpointing": Param(
        "bool",
        False,
        "Keep fewer activations and compute them again in the backward pass: less memory "
        "for longer sequences or larger micro-batches, about a third more time a step.",
        advanced=True,
    ),
}


def with_defaults(params: Mapping[str, Param], given: Mapping[str, Any]) -> dict[str, Any]:
    """A template's params as its network reads them: each declared param's given value, else
    its default (undeclared names dropped), an ``int_list`` given as ``"64,32"`` made a list."""
    merged = {name: given.get(name, param.default) for name, param in params.items()}
    for name, param in params.items():
        value = merged[name]
        if param.type == "int_list":
            items = value.split(",") if isinstance(value, str) else value
            merged[name] = [int(x) for x in items if str(x).strip()]
    return merged


declare_template("logreg", params=LOGREG_PARAMS, builder="training.templates.logreg:build")
declare_template(
    "fine_ranking", params=FINE_RANKING_PARAMS, builder="training.templates.fine_ranking:build"
)
declare_template("deepfm", params=DEEPFM_PARAMS, builder="training.templates.deepfm:build")
declare_template("two_tower", params=TWO_TOWER_PARAMS, builder="training.templates.two_tower:build")
declare_template(
    "lightgbm",
    params=LIGHTGBM_PARAMS,
    builder="training.templates.lightgbm:build",
    model_file=LIGHTGBM_MODEL_FILE,
)
declare_template(
    "lm_lora",
    params=LM_LORA_PARAMS,
    builder="training.lm:build",
    model_file=LM_ADAPTER_FILE,
)
declare_template(
    "lm_full",
    params=LM_FULL_PARAMS,
    builder="training.lm:build",
    model_file=LM_FULL_MODEL_FILE,
)
