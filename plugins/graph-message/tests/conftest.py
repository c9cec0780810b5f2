"""GPU tests (``@pytest.mark.gpu``) skip where CuPy or a CUDA device is missing."""

import pytest

from foxhunt_core.backend import cuda_available


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not cuda_available():
        pytest.skip("needs CuPy and a CUDA GPU")
