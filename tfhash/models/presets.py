"""Paper hyper-parameters as named presets (SCDH Sec. V; docs/design.md s.4). Every value can be
overridden by keyword in the model builders."""

from __future__ import annotations

__all__ = ["SCDH_PRESETS", "resolve_preset"]


SCDH_PRESETS: dict[str, dict] = {
    # lambda, mu, alpha of SCDH's CIFAR-10 experiments.
    "cifar10": {"lam": 0.005, "mu": 0.2, "alpha": 0.05},
    "nuswide": {"lam": 0.001, "mu": 0.1, "alpha": 1.0},
    # ImageNet: centre norms held at s = 8 for the first 5 epochs (warm-up, SCDH Sec. IV-D).
    "imagenet": {"lam": 0.001, "mu": 0.1, "alpha": 4.0, "warmup_norm": 8.0, "warmup_epochs": 5},
}


def resolve_preset(preset: str | None, overrides: dict) -> dict:
    """The preset's values updated by the non-None ``overrides``.

    Raises:
        ValueError: unknown preset name.
    """
    if preset is None:
        base: dict = {}
    elif preset in SCDH_PRESETS:
        base = dict(SCDH_PRESETS[preset])
    else:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(SCDH_PRESETS)}")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return base
