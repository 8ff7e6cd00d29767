"""Keras layers of tfhash (registered as serializable under package "tfhash")."""

from tfhash.layers.hash_head import HashHead
from tfhash.layers.input_maps import INPUT_MAPS, RBFFeatures, input_map_layers, rbf_kernel
from tfhash.layers.proxies import FixedProxies, LearnableProxies
from tfhash.layers.semantic_clusters import SemanticClusters, negative_distances

__all__ = ["FixedProxies", "LearnableProxies", "HashHead", "SemanticClusters", "negative_distances", "RBFFeatures", "rbf_kernel",
           "input_map_layers", "INPUT_MAPS"]
