"""Shared fixtures and the hypothesis profiles.

MINISPEC_PROFILE selects the profile: dev (default, quick), ci (derandomized, what .ci/run
uses), thorough (many examples, for a nightly-style run). `--device cuda` (or MINISPEC_DEVICE=cuda)
runs tests/test_device.py's loop properties on that device.
"""

import os
import sys
from pathlib import Path

import pytest

from minispec.testing import load_profile

load_profile()

# The scripts' tests import them by name: scripts/ (the shared harness) and each folder of scripts.
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path[:0] = [str(SCRIPTS)] + sorted(str(folder) for folder in SCRIPTS.iterdir()
                                        if folder.is_dir() and folder.name not in ("data", "__pycache__"))


def pytest_addoption(parser):
    parser.addoption("--device", default=None,
                     help="torch device for tests/test_device.py (default: $MINISPEC_DEVICE, else cpu)")


def pytest_configure(config):
    config.addinivalue_line("markers", "pair: needs the converted Qwen2.5-Coder pair (tests/test_real_pair.py); "
                                       "skipped where it is absent")
    if config.getoption("--device"):
        os.environ["MINISPEC_DEVICE"] = config.getoption("--device")


@pytest.fixture(scope="session")
def real_ckpt():
    """The converted SmolLM2-135M-Instruct folder (fetched and converted on first use)."""
    from minispec.checkpoints.fetch import ensure_default_checkpoint

    return ensure_default_checkpoint(quiet=True)


@pytest.fixture(scope="session")
def real_model(real_ckpt):
    from minispec import load_model

    return load_model(real_ckpt)


@pytest.fixture(scope="session")
def real_tokenizer(real_ckpt):
    from minispec import load_tokenizer

    return load_tokenizer(real_ckpt)


@pytest.fixture(scope="session")
def real_fast_model(real_ckpt):
    """The real checkpoint with the fast kernels (packed, fused weights; embedding mapped from the file), float32."""
    from minispec import kernels, load_model

    return kernels.apply(load_model(real_ckpt), "fast", checkpoint=real_ckpt)


@pytest.fixture(params=["reference", "fast"])
def real_model_any(request):
    """The real checkpoint, once per kernels kind that computes its function: the same checks must hold on both."""
    return request.getfixturevalue("real_model" if request.param == "reference" else "real_fast_model")
