"""Hypothesis profiles: dev (quick, default), ci (derandomized), thorough (nightly-style), and
mutation (ci without shrinking or the example database; scripts/tooling/mutation_check.py uses it).

    MINISPEC_PROFILE=ci python -m pytest -q

`load_profile()` registers the three and loads the one MINISPEC_PROFILE names; minispec's own
tests/conftest.py calls it, and so can yours.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = {
    "dev": dict(max_examples=15),
    "ci": dict(max_examples=30, derandomize=True, print_blob=True),
    "thorough": dict(max_examples=500),
    "mutation": dict(max_examples=30, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.reuse, Phase.generate]),
}


def load_profile(name: str | None = None) -> str:
    """Register dev / ci / thorough and load `name` (default: $MINISPEC_PROFILE or "dev")."""
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    for key, values in PROFILES.items():
        settings.register_profile(key, **common, **values)
    name = name or os.environ.get("MINISPEC_PROFILE", "dev")
    if name not in PROFILES:
        raise ValueError(f"MINISPEC_PROFILE = {name!r}; expected one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name
