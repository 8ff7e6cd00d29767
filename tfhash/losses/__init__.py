"""Hashing losses: pure TensorFlow functions (tensors in, scalar out, mean over the batch) and
thin Keras ``Loss`` wrappers. Formulas: DESIGN.md s.4."""

from tfhash.losses.jcch_coefficients import jcch_coefficients
from tfhash.losses.keras_losses import (
    ClassifierCrossEntropy,
    QuantizationLoss,
    SemanticClusterUnaryLoss,
)
from tfhash.losses.mean_teacher import (
    mean_teacher_consistency,
    sigmoid_rampup,
    softmax_squared_distance,
)
from tfhash.losses.pairwise import pairwise_likelihood_loss, pairwise_similarity
from tfhash.losses.proxy import (
    balanced_binary_cross_entropy,
    best_known_min_distance,
    hamming_triplet_loss,
    hyp2_loss,
    hyp2_zeta,
)
from tfhash.losses.quantization import quantization_loss
from tfhash.losses.scdh import alignment_loss, cross_modal_loss, scdh_loss
from tfhash.losses.semantic_cluster import (
    classifier_cross_entropy,
    cluster_cross_entropy,
    label_weights,
    semantic_cluster_unary_loss,
)

__all__ = [
    "ClassifierCrossEntropy",
    "QuantizationLoss",
    "SemanticClusterUnaryLoss",
    "alignment_loss",
    "balanced_binary_cross_entropy",
    "best_known_min_distance",
    "hamming_triplet_loss",
    "hyp2_loss",
    "hyp2_zeta",
    "classifier_cross_entropy",
    "cluster_cross_entropy",
    "cross_modal_loss",
    "jcch_coefficients",
    "label_weights",
    "mean_teacher_consistency",
    "pairwise_likelihood_loss",
    "pairwise_similarity",
    "quantization_loss",
    "scdh_loss",
    "semantic_cluster_unary_loss",
    "sigmoid_rampup",
    "softmax_squared_distance",
]
