"""The FuxiCTR peer of the ``quality`` bench: DCNv2 and DeepFM, trained and scored in FuxiCTR's
own virtualenv (``bench/.venvs/fuxictr/``, see ``requirements.txt`` beside this file).

``python driver.py <config.json>``; the config names the shared dataset (one Parquet file with
the raw feature columns, the label and a ``split`` column of train/validation/test, the same rows
every model of the run gets), the feature columns, the model, its published BARS hyperparameters,
the seeds and an output folder. For each seed it writes ``<model>_seed<k>_{validation,test}.npy``
(click probabilities, in the order of the dataset's rows of that split) and a ``<model>.json``
with what each run did (epochs, seconds). The bench computes every metric itself, with the same
code for every model.

Everything FuxiCTR ships is used as shipped: ``FeatureProcessor`` (polars) fits the tokenizers on
the train rows and encodes the splits (Criteo's numeric columns go through the package's own
``datasets.criteo.CustomizedFeatureProcessor.convert_to_bucket``, as FuxiCTR's Criteo configs
do), the splits are saved as ``.npz`` and read with ``NpzDataLoader`` (not the Ray-based
pipeline of ``build_dataset``, which is slow on two cores), and training is ``BaseModel.fit``:
Adam, gradient clipping, evaluation on the validation rows each epoch, the learning rate cut
tenfold on a plateau, early stopping with the BARS patience, the best epoch's weights restored.

The two model classes are not in the pip package (its ``model_zoo`` holds only ``LongCTR``);
they are written here from the package's own layers in the way the project's model zoo composes
them:

- DCNv2: https://github.com/reczoo/FuxiCTR/blob/main/model_zoo/DCNv2/src/DCNv2.py
- DeepFM: https://github.com/reczoo/FuxiCTR/blob/main/model_zoo/DeepFM/DeepFM_torch/src/DeepFM.py
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import torch
from fuxictr.datasets.criteo import CustomizedFeatureProcessor
from fuxictr.features import FeatureMap
from fuxictr.pytorch.dataloaders.npz_dataloader import NpzDataLoader
from fuxictr.pytorch.layers import CrossNetV2, FactorizationMachine, FeatureEmbedding, MLP_Block
from fuxictr.pytorch.models import BaseModel
from fuxictr.pytorch.torch_utils import seed_everything

SPLITS = ("train", "validation", "test")


class DCNv2(BaseModel):
    """DCNv2 (parallel/stacked structures; no low-rank mixture: BARS runs use the full-rank
    CrossNetV2), as in FuxiCTR's ``model_zoo/DCNv2/src/DCNv2.py``."""

    def __init__(
        self,
        feature_map,
        model_id="DCNv2",
        gpu=-1,
        model_structure="parallel",
        learning_rate=1e-3,
        embedding_dim=10,
        stacked_dnn_hidden_units=(),
        parallel_dnn_hidden_units=(),
        dnn_activations="ReLU",
        num_cross_layers=3,
        net_dropout=0,
        batch_norm=False,
        embedding_regularizer=None,
        net_regularizer=None,
        **kwargs,
    ):
        super().__init__(
            feature_map,
            model_id=model_id,
            gpu=gpu,
            embedding_regularizer=embedding_regularizer,
            net_regularizer=net_regularizer,
            **kwargs,
        )
        self.embedding_layer = FeatureEmbedding(feature_map, embedding_dim)
        input_dim = feature_map.sum_emb_out_dim()
        self.crossnet = CrossNetV2(input_dim, num_cross_layers)
        self.model_structure = model_structure
        if model_structure not in ("crossnet_only", "stacked", "parallel", "stacked_parallel"):
            raise ValueError(f"model_structure={model_structure} not supported")
        mlp = {
            "input_dim": input_dim,
            "output_dim": None,
            "hidden_activations": dnn_activations,
            "output_activation": None,
            "dropout_rates": net_dropout,
            "batch_norm": batch_norm,
        }
        final_dim = input_dim
        if model_structure in ("stacked", "stacked_parallel"):
            self.stacked_dnn = MLP_Block(hidden_units=list(stacked_dnn_hidden_units), **mlp)
            final_dim = stacked_dnn_hidden_units[-1]
        if model_structure in ("parallel", "stacked_parallel"):
            self.parallel_dnn = MLP_Block(hidden_units=list(parallel_dnn_hidden_units), **mlp)
            final_dim = input_dim + parallel_dnn_hidden_units[-1]
        if model_structure == "stacked_parallel":
            final_dim = stacked_dnn_hidden_units[-1] + parallel_dnn_hidden_units[-1]
        self.fc = torch.nn.Linear(final_dim, 1)
        self.compile(kwargs["optimizer"], kwargs["loss"], learning_rate)
        self.reset_parameters()
        self.model_to_device()

    def forward(self, inputs):
        X = self.get_inputs(inputs)
        feature_emb = self.embedding_layer(X, flatten_emb=True)
        cross_out = self.crossnet(feature_emb)
        if self.model_structure == "crossnet_only":
            final_out = cross_out
        elif self.model_structure == "stacked":
            final_out = self.stacked_dnn(cross_out)
        elif self.model_structure == "parallel":
            final_out = torch.cat([cross_out, self.parallel_dnn(feature_emb)], dim=-1)
        else:
            final_out = torch.cat(
                [self.stacked_dnn(cross_out), self.parallel_dnn(feature_emb)], dim=-1
            )
        return {"y_pred": self.output_activation(self.fc(final_out))}


class DeepFM(BaseModel):
    """DeepFM: FM (first-order LR + pairwise interactions) plus an MLP over the embeddings, as
    in FuxiCTR's ``model_zoo/DeepFM/DeepFM_torch/src/DeepFM.py``."""

    def __init__(
        self,
        feature_map,
        model_id="DeepFM",
        gpu=-1,
        learning_rate=1e-3,
        embedding_dim=10,
        hidden_units=(64, 64, 64),
        hidden_activations="ReLU",
        net_dropout=0,
        batch_norm=False,
        embedding_regularizer=None,
        net_regularizer=None,
        **kwargs,
    ):
        super().__init__(
            feature_map,
            model_id=model_id,
            gpu=gpu,
            embedding_regularizer=embedding_regularizer,
            net_regularizer=net_regularizer,
            **kwargs,
        )
        self.embedding_layer = FeatureEmbedding(feature_map, embedding_dim)
        self.fm = FactorizationMachine(feature_map)
        self.mlp = MLP_Block(
            input_dim=feature_map.sum_emb_out_dim(),
            output_dim=1,
            hidden_units=list(hidden_units),
            hidden_activations=hidden_activations,
            output_activation=None,
            dropout_rates=net_dropout,
            batch_norm=batch_norm,
        )
        self.compile(kwargs["optimizer"], kwargs["loss"], learning_rate)
        self.reset_parameters()
        self.model_to_device()

    def forward(self, inputs):
        X = self.get_inputs(inputs)
        feature_emb = self.embedding_layer(X)
        y_pred = self.fm(X, feature_emb)
        y_pred += self.mlp(feature_emb.flatten(start_dim=1))
        return {"y_pred": self.output_activation(y_pred)}


MODELS = {"DCNv2": DCNv2, "DeepFM": DeepFM}


def feature_cols(config: dict) -> list[dict]:
    cols: list[dict] = []
    if config["categorical"]:
        cols.append(
            {"name": config["categorical"], "active": True, "dtype": "str", "type": "categorical"}
        )
    if config.get("bucketed"):
        # FuxiCTR's Criteo recipe: numeric counts -> floor(log(x)^2) buckets, as categories.
        cols.append(
            {
                "name": config["bucketed"],
                "active": True,
                "dtype": "float",
                "type": "categorical",
                "preprocess": "convert_to_bucket",
            }
        )
    return cols


def encode(config: dict, work: Path):
    """Fit FuxiCTR's feature processor on the train rows; write each split as ``.npz``."""
    frame = pd.read_parquet(config["data"])
    label = config["label"]
    for name in config["categorical"]:
        frame[name] = frame[name].map(lambda v: "" if v is None or v != v else str(v))
    for name in config.get("bucketed", []):
        frame[name] = frame[name].astype("float64")
    frame[label] = frame[label].astype("float64")
    processor = CustomizedFeatureProcessor(
        feature_cols=feature_cols(config),
        label_col={"name": label, "dtype": "float"},
        dataset_id=config["dataset_id"],
        data_root=str(work),
    )
    columns = config["categorical"] + config.get("bucketed", []) + [label]
    lazy = {
        split: processor.preprocess(
            pl.from_pandas(frame.loc[frame["split"] == split, columns]).lazy()
        )
        for split in SPLITS
    }
    processor.fit(lazy["train"], min_categr_count=1)
    paths = {}
    for split in SPLITS:
        collected = lazy[split].collect()
        batch = {name: collected[name].to_numpy() for name in collected.columns}
        batch = processor.transform(batch)
        arrays = {name: np.asarray(values) for name, values in batch.items()}
        paths[split] = str(work / f"{split}.npz")
        np.savez(paths[split], **arrays)
    # As FuxiCTR's run_expid.py does: the map is read back from the JSON the processor wrote,
    # with the model's params (the default embedding width comes from them).
    feature_map = FeatureMap(config["dataset_id"], processor.data_dir)
    feature_map.load(processor.json_file, params=config["params"])
    return feature_map, paths


def run_one(config: dict, feature_map, paths: dict, seed: int, out: Path) -> dict:
    params = dict(config["params"])
    model_name = config["model"]
    seed_everything(seed)
    model = MODELS[model_name](
        feature_map,
        model_id=f"{model_name}_seed{seed}",
        gpu=-1,
        task="binary_classification",
        loss="binary_crossentropy",
        optimizer="adam",
        metrics=["AUC", "logloss"],
        verbose=0,
        model_root=str(out / "checkpoints"),
        **params,
    )
    os.makedirs(model.model_dir, exist_ok=True)  # run_expid.py's job, before fit()
    batch = int(config["batch_size"])
    train = NpzDataLoader(
        feature_map, paths["train"], batch_size=batch, shuffle=True, num_workers=0
    )
    started = time.perf_counter()
    model.fit(
        train,
        epochs=int(config["epochs"]),
        validation_data=NpzDataLoader(feature_map, paths["validation"], batch_size=batch),
        max_gradient_norm=10.0,
    )
    fit_s = time.perf_counter() - started
    for split in ("validation", "test"):
        prob = model.predict(NpzDataLoader(feature_map, paths[split], batch_size=batch))
        np.save(out / f"{model_name}_seed{seed}_{split}.npy", np.asarray(prob, dtype=np.float64))
    return {
        "seed": seed,
        "fit_s": round(fit_s, 2),
        "epochs": int(model._epoch_index) + 1,
        "best_validation_auc": float(model._best_metric),
    }


def main(path: str) -> int:
    config = json.loads(Path(path).read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(int(config.get("threads", 1)))
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    work = out / "data"
    work.mkdir(parents=True, exist_ok=True)
    feature_map, paths = encode(config, work)
    runs = [run_one(config, feature_map, paths, int(seed), out) for seed in config["seeds"]]
    (out / f"{config['model']}.json").write_text(json.dumps({"runs": runs}, indent=1))
    print(json.dumps({"model": config["model"], "runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1]))
