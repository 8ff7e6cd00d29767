"""Model versions under a TF Serving model base directory, and TF Serving's version policies.

A version is a sub-directory whose name is a positive integer and that holds a ``saved_model.pb``
(what ``tensorflow_model_server`` and the TFX Pusher agree on). A folder without that file (a push
still being copied, a stray directory) is not a version yet.
"""

from __future__ import annotations

import os


def list_versions(base_path: str) -> list[int]:
    """The complete versions under ``base_path``, ascending. A missing base path has none."""
    if not os.path.isdir(base_path):
        return []
    found = []
    for name in os.listdir(base_path):
        if name.isdigit() and int(name) > 0 and os.path.isfile(os.path.join(base_path, name, "saved_model.pb")):
            found.append(int(name))
    return sorted(found)


def select_versions(available: list[int], policy) -> list[int]:
    """The versions a ``ServableVersionPolicy`` (models.config ``model_version_policy``) serves.

    ``latest {num_versions: N}`` (TF Serving's default, N = 1), ``all {}``, or ``specific {versions:
    ...}`` (only those that exist).
    """
    available = sorted(available)
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "all":
        return available
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if choice == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]
