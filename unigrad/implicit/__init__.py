"""Derivatives of solutions: ``linear_solve``, ``custom_root``, ``custom_fixed_point``.

The derivative of a solver's result comes from the equation it solves (the implicit function
theorem), not from its iterations: written once, on unigrad's custom rules, so it runs on every
backend in both modes and to any order (MLX: first order, and second order over one VJP; docs/implicit.md).
"""

from ._linear_solve import ConvergenceError, ConvergenceWarning, linear_solve
from ._root import custom_fixed_point, custom_root

__all__ = ["linear_solve", "custom_root", "custom_fixed_point", "ConvergenceError", "ConvergenceWarning"]
