"""Retrieval mAP at epoch end, logged to the history and TensorBoard (like TF Similarity's
EvalCallback)."""

from __future__ import annotations

import keras
import numpy as np

from tfhash.codes import sign_codes
from tfhash.metrics import evaluate_retrieval
from tfhash.models.base import EncoderMixin

__all__ = ["RetrievalEvalCallback"]


class RetrievalEvalCallback(keras.callbacks.Callback):
    """Encode a query and a database set with the model being trained and log ``val_map``
    (mAP@R) and ``val_precision_h2`` every ``frequency`` epochs.

    A tfhash model encodes with its encoders (``model.encoder``): the queries with
    ``query_modality``'s, the database with ``db_modality``'s (``None``: the one of a single-input
    model; name both for a cross-modal model, e.g. ``"image"`` and ``"text"``). Any other model's
    ``predict`` must return the continuous codes, or a dict holding ``"codes"``. Placed before a
    ``TensorBoard`` callback in the list, the values reach TensorBoard too (Keras passes the same
    ``logs`` dict along).

    Args:
        query_x, query_labels, db_x, db_labels: the evaluation split.
        top_r: depth of AP@R (None = all).
        frequency: evaluate every ``frequency`` epochs.
        prefix: prefix of the logged names.
        query_modality, db_modality: the modalities of ``query_x`` and ``db_x``.
    """

    def __init__(self, query_x, query_labels, db_x, db_labels, top_r=None, frequency: int = 1,
                 batch_size: int = 512, prefix: str = "val_", query_modality: str | None = None,
                 db_modality: str | None = None):  # fmt: skip
        super().__init__()
        self.query_x, self.db_x = query_x, db_x
        self.query_labels, self.db_labels = np.asarray(query_labels), np.asarray(db_labels)
        self.top_r, self.frequency, self.batch_size, self.prefix = top_r, int(frequency), batch_size, prefix
        self.query_modality, self.db_modality = query_modality, db_modality

    def _codes(self, x, modality: str | None) -> np.ndarray:
        if isinstance(self.model, EncoderMixin):
            return self.model.encode(x, modality, self.batch_size)
        out = self.model.predict(x, batch_size=self.batch_size, verbose=0)
        return sign_codes(np.asarray(out["codes"] if isinstance(out, dict) else out))

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.frequency:
            return
        query_codes, db_codes = self._codes(self.query_x, self.query_modality), self._codes(self.db_x, self.db_modality)
        report = evaluate_retrieval(query_codes, db_codes, self.query_labels, self.db_labels, top_r=self.top_r)
        logs[f"{self.prefix}map"] = report.mean_average_precision()
        logs[f"{self.prefix}precision_h2"] = report.precision_at_radius(2)
