"""Run with the mlflow peer venv's python: log the RankOps bundle as an MLflow pyfunc model.

    python log_model.py BUNDLE_DIR REPO_TRAINING_DIR TRACKING_URI  -> prints the model URI

The pyfunc loads the same bundle (spec + state dict) with the same encoder and template code, so
``mlflow models serve`` scores exactly what our gateway scores.
"""

import sys

import mlflow
import mlflow.pyfunc


class RankOpsBundle(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import torch

        torch.set_num_threads(1)
        from training.bundle import load_bundle

        self.bundle = load_bundle(context.artifacts["bundle"])

    def predict(self, context, model_input, params=None):
        columns = {c: model_input[c].tolist() for c in model_input.columns}
        return self.bundle.predict(columns, len(model_input))


def main() -> None:
    bundle, training_dir, tracking = sys.argv[1:4]
    mlflow.set_tracking_uri(tracking)
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=RankOpsBundle(),
            artifacts={"bundle": bundle},
            code_paths=[training_dir],
            pip_requirements=["torch", "numpy", "pandas"],
        )
    print(info.model_uri)


if __name__ == "__main__":
    main()
