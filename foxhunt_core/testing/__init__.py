"""Test utilities shared by the core's and the plugins' test suites."""

from .gradcheck import check_tree_gradients, numeric_gradient, relative_error

__all__ = ["check_tree_gradients", "numeric_gradient", "relative_error"]
