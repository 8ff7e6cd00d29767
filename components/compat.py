"""Compatibility switches for the tested dependency set (constraints/py310.txt).

TFT 1.16's deep-copy optimization (on in TFX's Transform executor) rebuilds Beam
``AppliedPTransform`` objects with the constructor arguments of older Beam releases; on Beam 2.74
a Transform with more than one analysis phase (e.g. the JCCH coefficients: anchors, then counts,
then the Eq. 14 rescaling) fails with "AppliedPTransform.__init__() missing 2 required positional
arguments: 'environment_id' and 'annotations'". The optimization only lets Beam fuse copies of
the analysed data instead of materialising it, so turning it off changes no result.
"""

from __future__ import annotations

__all__ = ["disable_tft_deep_copy"]


def disable_tft_deep_copy() -> None:
    """Make tf.Transform ignore ``use_deep_copy_optimization`` (see module docstring)."""
    from tensorflow_transform.beam import context

    context.Context.get_use_deep_copy_optimization = classmethod(lambda cls: False)
