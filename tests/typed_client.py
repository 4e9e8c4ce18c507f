"""A library's use of unigrad's public API, type-checked by mypy in tests/test_typing.py (not collected by pytest).

Written as a downstream package would write it, with its own annotations: every call here must type-check
against the signatures unigrad ships (``unigrad/py.typed``). It is also run by that test, so it is right as
well as well typed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

import unigrad
import unigrad.testing
from unigrad.backend import Backend, Capabilities

Array = npt.NDArray[np.float64]


def energy(x: Array) -> Any:
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) * x ** 2)


def residuals(x: Array) -> Any:
    xp = unigrad.namespace(x)
    return xp.stack([x[0] * x[1], xp.exp(x[0]), x[1] ** 3])


def model(w: Array, x: Array) -> Any:
    xp = unigrad.namespace(w, x)
    return xp.tanh(x @ w)


def gradient_step(x: Array, rate: float = 0.1) -> Array:
    grad_energy: Callable[..., Any] = unigrad.grad(energy)
    step = np.asarray(unigrad.to_numpy(grad_energy(x)), dtype=np.float64)  # (to_numpy: any pytree)
    return x - rate * step


def everything(x: Array) -> dict[str, Any]:
    value, g = unigrad.value_and_grad(energy, argnums=0, has_aux=False)(x)
    J = unigrad.jacobian(residuals, mode="rev", chunk_size=None)(x)
    J_fwd = unigrad.jacobian(residuals, argnums=0, mode="fwd", backend="numpy")(x)
    xs = np.stack([x, 2.0 * x, 3.0 * x])
    blocks = unigrad.batched_jacobian(lambda b: unigrad.namespace(b).sin(b), mode="auto")(xs)
    H = unigrad.hessian(energy)(x)
    out, vjp_fn = unigrad.vjp(residuals, x)
    (row,) = vjp_fn(np.array([1.0, 0.0, 0.0]))
    out2, column = unigrad.jvp(residuals, (x,), (np.ones_like(x),))
    (hv,) = unigrad.hvp(energy, (x,), (np.ones_like(x),))
    per_example = unigrad.per_example_grad(lambda w, b: model(w, b)[:, 0] ** 2)(np.ones((2, 1)), xs[:, :2])
    return {"value": value, "grad": g, "J": J, "J_fwd": J_fwd, "blocks": blocks, "H": H, "out": out,
            "row": row, "out2": out2, "column": column, "hv": hv, "per_example": per_example}


def per_parameter(params: dict[str, Array], xs: Array) -> dict[str, tuple[int, ...]]:
    grads = unigrad.grad(lambda p, b: unigrad.namespace(b).sum(model(p["w"], b) ** 2))(params, xs)
    return {name: g.shape for name, g in unigrad.to_numpy(grads).items()}  # a pytree back as a pytree


def checked(x: Array) -> None:
    unigrad.testing.check_grads(residuals, (x,), order=1, modes=("fwd", "rev"), seed=0)
    unigrad.testing.check_grads(energy, [x], order=2, rng=np.random.default_rng(1), fd_method="central")


def on_backend(name: str, x: Array) -> Array:
    with unigrad.use_backend(name) as b:
        chosen: Backend = b
        caps: Capabilities = chosen.capabilities
        assert isinstance(caps.forward_mode, bool)
        return np.asarray(unigrad.to_numpy(unigrad.grad(energy)(x)), dtype=np.float64)


def main() -> None:
    x = np.array([0.3, -0.7])
    results = everything(x)
    np.testing.assert_allclose(results["grad"], np.sin(x) * 2 * x + np.cos(x) * x ** 2)
    np.testing.assert_allclose(results["J"], results["J_fwd"])
    np.testing.assert_allclose(results["row"], results["J"][0])
    np.testing.assert_allclose(results["column"], results["J"].sum(axis=1))
    h = -x ** 2 * np.sin(x) + 4 * x * np.cos(x) + 2 * np.sin(x)  # the Hessian's diagonal (it is diagonal)
    np.testing.assert_allclose(results["H"], np.diag(h))
    np.testing.assert_allclose(results["hv"], h)
    np.testing.assert_allclose(results["blocks"], [np.diag(np.cos(k * x)) for k in (1.0, 2.0, 3.0)])
    np.testing.assert_allclose(gradient_step(x), x - 0.1 * results["grad"])
    np.testing.assert_allclose(on_backend("numpy", x), results["grad"])
    checked(x)
    assert per_parameter({"w": np.ones((2, 3))}, np.ones((4, 2))) == {"w": (2, 3)}


if __name__ == "__main__":
    main()
