"""Hashing losses: pure TensorFlow functions and thin Keras ``Loss`` wrappers. Formulas: docs/design.md s.4.

Each loss comes as a per-example function (``*_per_example``: tensors in, an ``(n,)`` vector out)
and as the batch scalar, the per-example values reduced by :func:`reduce_per_example` (the mean;
with ``sample_weight``, Keras's ``"sum_over_batch_size"``: sum_i w_i L_i / n). See
:mod:`tfhash.losses.reduction` for terms normalised over the whole batch.
"""

from tfhash.losses.jcch_coefficients import jcch_coefficients
from tfhash.losses.keras_losses import (
    BalancedBinaryCrossEntropy,
    ClassifierCrossEntropy,
    CodeAlignmentLoss,
    HammingTripletLoss,
    HyP2PairLoss,
    HyP2ProxyLoss,
    PairwiseLikelihoodLoss,
    QuantizationLoss,
    SemanticClusterUnaryLoss,
    SoftmaxSquaredDistance,
)
from tfhash.losses.mean_teacher import (
    mean_teacher_consistency,
    mean_teacher_consistency_per_example,
    sigmoid_rampup,
    softmax_squared_distance,
)
from tfhash.losses.pairwise import (
    in_batch_pairwise_per_example,
    pairwise_likelihood_loss,
    pairwise_likelihood_per_example,
    pairwise_similarity,
)
from tfhash.losses.proxy import (
    balanced_binary_cross_entropy,
    balanced_binary_cross_entropy_per_example,
    best_known_min_distance,
    hamming_triplet_loss,
    hamming_triplet_per_example,
    hyp2_loss,
    hyp2_pair_per_example,
    hyp2_per_example,
    hyp2_proxy_per_example,
    hyp2_zeta,
)
from tfhash.losses.quantization import quantization_loss, quantization_per_example
from tfhash.losses.reduction import batch_shares, reduce_parts, reduce_per_example, rows_taking_part
from tfhash.losses.scdh import (
    alignment_loss,
    alignment_per_example,
    cross_modal_loss,
    cross_modal_per_example,
    cross_modal_total,
    scdh_loss,
    scdh_per_example,
    scdh_total,
)
from tfhash.losses.semantic_cluster import (
    classifier_cross_entropy,
    classifier_cross_entropy_per_example,
    cluster_cross_entropy,
    label_weights,
    semantic_cluster_unary_loss,
    semantic_cluster_unary_per_example,
)

__all__ = [
    "BalancedBinaryCrossEntropy",
    "ClassifierCrossEntropy",
    "CodeAlignmentLoss",
    "HammingTripletLoss",
    "HyP2PairLoss",
    "HyP2ProxyLoss",
    "PairwiseLikelihoodLoss",
    "QuantizationLoss",
    "SemanticClusterUnaryLoss",
    "SoftmaxSquaredDistance",
    "alignment_loss",
    "alignment_per_example",
    "balanced_binary_cross_entropy",
    "balanced_binary_cross_entropy_per_example",
    "batch_shares",
    "best_known_min_distance",
    "classifier_cross_entropy",
    "classifier_cross_entropy_per_example",
    "cluster_cross_entropy",
    "cross_modal_loss",
    "cross_modal_per_example",
    "cross_modal_total",
    "hamming_triplet_loss",
    "hamming_triplet_per_example",
    "hyp2_loss",
    "hyp2_pair_per_example",
    "hyp2_per_example",
    "hyp2_proxy_per_example",
    "hyp2_zeta",
    "jcch_coefficients",
    "label_weights",
    "mean_teacher_consistency",
    "mean_teacher_consistency_per_example",
    "in_batch_pairwise_per_example",
    "pairwise_likelihood_loss",
    "pairwise_likelihood_per_example",
    "pairwise_similarity",
    "quantization_loss",
    "quantization_per_example",
    "reduce_parts",
    "reduce_per_example",
    "rows_taking_part",
    "scdh_loss",
    "scdh_per_example",
    "scdh_total",
    "semantic_cluster_unary_loss",
    "semantic_cluster_unary_per_example",
    "sigmoid_rampup",
    "softmax_squared_distance",
]
