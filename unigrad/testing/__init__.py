"""Validation tools: gradient checks against finite differences and across backends.

- :func:`check_grads`: one backend's JVPs and VJPs against finite differences and each other, to any order.
- :func:`compare` / :func:`assert_backends_agree`: one function on every backend, one table.
- :func:`compare_implementations` / :func:`assert_implementations_agree` / :func:`tap`: two implementations
  of one model in different frameworks (a port), compared in values and derivatives, leaf by leaf.
- :mod:`unigrad.testing.strategies`: hypothesis strategies for shapes, dtypes, arrays and random
  portable programs (imported on demand: it needs hypothesis).
- :mod:`unigrad.testing.fuzz`: generated programs that break fast paths' analyses (batch size and
  positions, custom rules mixing rows, Python state changed between calls), each fast path checked
  against the exact answer (imported on demand: it needs hypothesis).
"""

from ._check_grads import FD_SAFETY, TOLERANCES, FiniteDifferencesInconclusive, GradientCheckError, check_grads
from ._programs import Program, ProgramCase, check_program, check_program_across, check_programs_across
from ..sparse._testing import check_sparse_hessian, check_sparse_jacobian, check_sparsity_covers
from ._compare import (AGREE, CONVENTION, DISAGREE, INCONCLUSIVE, PAIRWISE_TOLERANCES, BackendResult, Comparison,
                       assert_backends_agree, compare)
from ._implementations import (IMPLEMENTATION_TOLERANCES, ImplementationComparison, LeafResult, TapResult,
                               assert_implementations_agree, compare_implementations, tap)

__all__ = ["check_grads", "GradientCheckError", "FiniteDifferencesInconclusive", "FD_SAFETY", "INCONCLUSIVE", "TOLERANCES", "compare", "assert_backends_agree", "Comparison",
           "BackendResult", "PAIRWISE_TOLERANCES", "AGREE", "DISAGREE", "CONVENTION", "Program", "ProgramCase", "check_program",
           "check_program_across", "check_programs_across", "check_sparse_jacobian", "check_sparse_hessian",
           "check_sparsity_covers", "compare_implementations", "assert_implementations_agree", "tap",
           "ImplementationComparison", "LeafResult", "TapResult", "IMPLEMENTATION_TOLERANCES"]
