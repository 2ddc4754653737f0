"""minispec.checks: the one way each shared argument check is said (positive ints, gamma)."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from minispec.checks import check_gamma, is_int, positive_int
from minispec.errors import MinispecError


@given(value=st.integers(1, 2**70))
def test_positive_ints_pass_as_python_ints(value):
    assert positive_int(value, "x") == value and type(positive_int(value, "x")) is int
    assert check_gamma(value) == value


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, 2.5, "3", None, [1], float("nan")])
def test_anything_else_is_one_line_naming_the_argument(bad):
    with pytest.raises(MinispecError) as caught:
        positive_int(bad, "tree budget", "nodes per verify pass")
    assert str(caught.value) == f"tree budget = {bad!r}; expected an integer >= 1 (nodes per verify pass)"
    with pytest.raises(MinispecError, match=r"^gamma = .*; expected an integer >= 1$"):
        check_gamma(bad)


def test_integer_scalars_of_numpy_and_torch_count_as_ints_but_bools_do_not():
    assert is_int(np.int64(3)) and positive_int(np.int64(3), "x") == 3
    assert not is_int(True) and not is_int(np.float64(3.0)) and not is_int(torch.tensor(3.0))
