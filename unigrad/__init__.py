"""unigrad: one automatic-differentiation interface over many engines.

Write a function once; ask for ``vjp``, ``jvp``, ``grad``, ``jacobian``,
``batched_jacobian``, ``hessian``, ``hvp`` or ``vmap``; run it on unigrad's own
NumPy tape (the default) or on PyTorch, JAX, TensorFlow or a plugin backend.

``import unigrad`` imports no framework: backends load when first asked for.
"""

from ._api import (asarray, batched_jacobian, check_batch_independence, evaluate, grad, hessian,
                   hessian_vector_product, hvp, jacfwd, jacobian, jacrev, jvp, namespace, to_native, to_numpy,
                   value_and_grad, vjp, vmap)
from ._hessian import value_jacobian_and_hessian
from ._bridge import bridge
from ._checkpoint import checkpoint
from .per_example import per_example_grad, per_example_grad_norms
from ._registry import (backends, get_backend, register_backend, set_backend, unregister_backend, use_backend,
                        use_device)
from ._safe import safe_norm, safe_where
from ._custom import custom_jvp, custom_vjp, stop_gradient
from .implicit import custom_fixed_point, custom_root, linear_solve
from .sparse import sparse_hessian, sparse_jacobian
from .backend import Backend, Capabilities
from .dependence import SparsityWarning, hessian_sparsity, jacobian_sparsity

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("dask", "special"):  # unigrad.dask / unigrad.special without a separate import, loaded when used
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'unigrad' has no attribute {name!r}")

__all__ = [
    "vjp", "jvp", "grad", "value_and_grad", "jacobian", "jacrev", "jacfwd", "batched_jacobian",
    "check_batch_independence", "hessian", "value_jacobian_and_hessian", "hvp", "hessian_vector_product", "vmap",
    "evaluate", "per_example_grad", "per_example_grad_norms",
    "checkpoint", "bridge",
    "namespace", "asarray", "to_numpy", "to_native", "safe_where", "safe_norm",
    "backends", "get_backend", "set_backend", "use_backend", "register_backend", "unregister_backend", "use_device",
    "Backend", "Capabilities",
    "custom_vjp", "custom_jvp", "stop_gradient", "linear_solve", "custom_root", "custom_fixed_point",
    "jacobian_sparsity", "hessian_sparsity", "SparsityWarning", "sparse_jacobian", "sparse_hessian",
]
