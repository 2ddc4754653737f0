"""Shared fixtures and the hypothesis profiles.

MINISPEC_PROFILE selects the profile: dev (default, quick), ci (derandomized, what .ci/run
uses), thorough (many examples, for a nightly-style run).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=15, **_common)
settings.register_profile("ci", max_examples=30, derandomize=True, print_blob=True, **_common)
settings.register_profile("thorough", max_examples=500, **_common)
settings.load_profile(os.environ.get("MINISPEC_PROFILE", "dev"))


@pytest.fixture(scope="session")
def real_ckpt():
    """The converted SmolLM2-135M-Instruct folder (fetched and converted on first use)."""
    from minispec.weights import ensure_default_checkpoint

    return ensure_default_checkpoint(quiet=True)


@pytest.fixture(scope="session")
def real_model(real_ckpt):
    from minispec import load_model

    return load_model(real_ckpt)


@pytest.fixture(scope="session")
def real_tokenizer(real_ckpt):
    from minispec import load_tokenizer

    return load_tokenizer(real_ckpt)
