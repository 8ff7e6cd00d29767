"""Keras callbacks of tfhash."""

from tfhash.callbacks.cluster_warmup import ClusterNormWarmup
from tfhash.callbacks.retrieval_eval import RetrievalEvalCallback

__all__ = ["ClusterNormWarmup", "RetrievalEvalCallback"]
