"""Validation tools: gradient checks against finite differences and across backends."""

from ._check_grads import TOLERANCES, GradientCheckError, check_grads

__all__ = ["check_grads", "GradientCheckError", "TOLERANCES"]
