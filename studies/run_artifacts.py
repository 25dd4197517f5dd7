"""What a trial logs beside its params and metrics: its data as MLflow dataset inputs, and its
trained encoder as an ``mlflow.pytorch`` model.

Both go to MLflow's active run (``lifecycle.opened``) and are logged once per run: a resumed or
retried trial finds them there and logs nothing again.

* Inputs: the training and test splits the trial used, each a NumPy dataset named by the
  ``dataset`` key with a SHA-256 digest of its whole content (patches and labels; MLflow's own
  digest reads only the first 10,000 values), so two runs on the same data show the same digest.
  The digest is made a chunk at a time from the stored images (bytes), so logging the inputs
  before training never holds the splits as float32.
* Model: :class:`mae_core.models.FeatureEncoder` (patches ``[B,M,q]`` -> features ``[B,F]``),
  with its signature, saved with cloudpickle (MLflow's default ``pt2`` format traces the model
  with ``torch.export``: about 20x slower per trial here) and with ``mae_core`` as its code, so
  ``mlflow.pytorch.load_model`` needs torch and cloudpickle only. Off with ``log_model=false``;
  an encoder larger than ``log_model_max_mb`` is not logged and the run's ``model_not_logged``
  tag says why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from mlflow.tracking import MlflowClient

from mae_core.config import Config
from mae_core.images import ImageStore
from mae_core.models import feature_encoder
from mae_core.patches import patchify
from mae_core.data import PatchData

from . import tracking

MODEL_NAME = "encoder"  # the logged model's name in the run (and in the MLflow UI's model list)
MODEL_ID_TAG = "logged_model_id"  # set once the model is logged: a resumed trial does not log it again
MODEL_SKIPPED_TAG = "model_not_logged"
DIGEST_CHARS = 16  # of the SHA-256 hex digest (MLflow's digest column holds at most 36)


def content_digest(*arrays: torch.Tensor | np.ndarray) -> str:
    """SHA-256 over every array's dtype, shape and bytes, in order (the whole content)."""
    sha = hashlib.sha256()
    for array in arrays:
        _hash_array(sha, array)
    return sha.hexdigest()[:DIGEST_CHARS]


def _hash_array(sha, array: torch.Tensor | np.ndarray) -> None:
    values = np.ascontiguousarray(array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else array)
    sha.update(f"{values.dtype}{values.shape}".encode())
    sha.update(values.tobytes())


def split_digest(images: ImageStore, labels: torch.Tensor, patch_size: int) -> str:
    """``content_digest(patches, labels)`` of a split's float32 patches ``[N,M,q]``, made a chunk
    of stored images at a time: the trial never holds the split as floats before it trains."""
    sha = hashlib.sha256()
    sha.update(f"{np.dtype(np.float32)}{_patch_shape(images, patch_size)}".encode())
    for _, stored in images.chunks():
        floats = torch.from_numpy(np.ascontiguousarray(images.to_float(stored)))
        sha.update(np.ascontiguousarray(patchify(floats, patch_size).numpy()).tobytes())
    _hash_array(sha, labels)
    return sha.hexdigest()[:DIGEST_CHARS]


def _patch_shape(images: ImageStore, patch_size: int) -> tuple[int, int, int]:
    """(N, M, q) of a split's patches."""
    channels, height, width = images.image_shape
    return len(images), (height // patch_size) * (width // patch_size), patch_size ** 2 * channels


def _source(spec: str):
    """Where the data came from: the file or folder a ``kind:PATH`` dataset names (a local
    source) or a named dataset was found in; for a built-in dataset (made by code, no
    download), the loader that makes it."""
    import warnings

    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    from mae_core.named_datasets import NAMED, locate

    kind, _, path = spec.partition(":")
    if spec in NAMED:  # a named dataset: the folder it was read from
        path = str(locate(spec))
    if not path:
        return CodeDatasetSource(tags={"loader": "mae_core.data.load_dataset", "dataset": kind})
    with warnings.catch_warnings():  # local paths match two registered sources (file: and none): same class
        warnings.simplefilter("ignore")
        return resolve_dataset_source(str(Path(path).expanduser().resolve()))


def log_dataset_inputs(client: MlflowClient, run_id: str, config: Config, data: PatchData) -> None:
    """The training and test splits as the run's inputs (contexts ``train`` and ``test``)."""
    import mlflow
    from mlflow.data.numpy_dataset import from_numpy

    if client.get_run(run_id).inputs.dataset_inputs:
        return  # logged by an earlier attempt of this run
    for context, images, labels in (("train", data.train_images, data.train_labels),
                                    ("test", data.test_images, data.test_labels)):
        # MLflow reads only the features' shape and dtype when the digest is given: a stand-in
        # of one broadcast value describes the float patches without making them
        features = np.broadcast_to(np.float32(0), _patch_shape(images, data.patch_size))
        dataset = from_numpy(features, targets=labels.numpy(), source=_source(config.dataset),
                             name=config.dataset, digest=split_digest(images, labels, data.patch_size))
        _log_input_once(dataset, context)


# MLflow's SQL store looks a dataset up by (experiment, name, digest) and inserts it when absent,
# in two statements: two trials of a study that start together on the same data both miss it,
# and the second insert fails the unique constraint (seen on the first two trials of a study).
# The failed transaction wrote nothing, and the retry finds the other trial's row.
_INPUT_ATTEMPTS = 3


def _log_input_once(dataset, context: str) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    for attempt in range(1, _INPUT_ATTEMPTS + 1):
        try:
            mlflow.log_input(dataset, context=context)
            return
        except MlflowException as error:
            if attempt == _INPUT_ATTEMPTS or not _is_unique_violation(error):
                raise


def _is_unique_violation(error: Exception) -> bool:
    """A duplicate-key error from the store: SQLite and PostgreSQL say "unique constraint",
    MySQL "Duplicate entry"; through a tracking server the same text comes back."""
    text = str(error).lower()
    return "unique constraint" in text or "duplicate entry" in text


def encoder_megabytes(module: torch.nn.Module) -> float:
    """Parameters and buffers, in MB (10^6 bytes): about the size of the saved model."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def log_encoder(client: MlflowClient, run_id: str, model: torch.nn.Module, config: Config,
                example: torch.Tensor) -> str | None:
    """Log the trained encoder as the run's ``mlflow.pytorch`` model; its model id, or None
    when ``log_model`` is off or the encoder is over ``log_model_max_mb`` (then tagged why).
    ``example``: a few patches ``[n,M,q]`` for the model's signature."""
    if not config.log_model:
        return None
    tags = client.get_run(run_id).data.tags
    if MODEL_ID_TAG in tags:
        return tags[MODEL_ID_TAG]
    encoder = feature_encoder(model)
    size = encoder_megabytes(encoder)
    if size > config.log_model_max_mb:
        tracking.set_tags(client, run_id, {MODEL_SKIPPED_TAG: (
            f"encoder is {size:.1f} MB, over log_model_max_mb={config.log_model_max_mb:g}; "
            "raise the key to log it")})
        return None
    import cloudpickle
    import mlflow.pytorch
    from mlflow.models import infer_signature

    import mae_core

    inputs = example.detach().float().cpu()
    with torch.no_grad():
        outputs = encoder(inputs)
    torch_version = torch.__version__.split("+")[0]  # a local label (+cpu) is not on PyPI
    with tracking._quiet("mlflow.pytorch"):  # the advice to use pt2: cloudpickle is chosen above
        info = mlflow.pytorch.log_model(
            encoder, name=MODEL_NAME, signature=infer_signature(inputs.numpy(), outputs.numpy()),
            serialization_format="pickle", code_paths=[str(Path(mae_core.__file__).parent)],
            pip_requirements=[f"torch=={torch_version}", f"cloudpickle=={cloudpickle.__version__}"],
            step=config.steps,
        )
    tracking.set_tags(client, run_id, {MODEL_ID_TAG: info.model_id})
    return info.model_id
