"""Your own derivative, written once, on every backend: the four examples of docs/custom-derivatives.md.

1. A numerically stable softplus whose derivative is given by a JVP rule (``custom_jvp``).
2. A straight-through estimator: ``round`` forward, identity backward (``custom_vjp``).
3. Gradient clipping: the cotangent clipped on its way back (``custom_vjp`` with ``nondiff_argnums``).
4. Implicit differentiation of a fixed point ``x = T(x, theta)``: the forward pass iterates, the
   backward pass solves the adjoint linear system by VJPs of ``T`` -- never through the iterations.

Run ``python examples/custom_derivatives.py [backend]``; ``main(backend)`` asserts every result.
"""

from __future__ import annotations

import sys
from functools import partial

import numpy as np

import unigrad


# 1. stable softplus: log(1 + exp(x)) without overflow, and its derivative sigmoid(x) from a rule
@unigrad.custom_jvp
def softplus(x):
    xp = unigrad.namespace(x)
    return xp.maximum(x, 0.0) + xp.log1p(xp.exp(-xp.abs(x)))


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    xp = unigrad.namespace(x)
    sigmoid = xp.exp(-softplus(-x))  # never overflows; and the rule is differentiable: hessians work
    return softplus(x), t * sigmoid


# 2. straight-through estimator: round in the forward pass, the identity in the backward pass
@unigrad.custom_vjp
def round_ste(x):
    return unigrad.namespace(x).round(x)


round_ste.defvjp(lambda x: (round_ste(x), None), lambda residuals, g: (g,))


# 3. gradient clipping: the value passes unchanged, the cotangent is clipped to [-bound, bound]
@partial(unigrad.custom_vjp, nondiff_argnums=(1,))
def clip_gradient(x, bound):
    return x


def _clip_fwd(x, bound):
    return x, None


def _clip_bwd(bound, residuals, g):
    return (unigrad.namespace(g).clip(g, -bound, bound),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


# 4. implicit differentiation of the fixed point x* = T(x*, theta)
def T(x, theta):
    xp = unigrad.namespace(x, theta)
    return 0.5 * xp.cos(x) * theta + 0.1


def iterate(fn, start, steps=40):
    value = start
    for _ in range(steps):  # a fixed count: the same code runs eagerly and compiled
        value = fn(value)
    return value


@unigrad.custom_vjp
def fixed_point(theta):
    return iterate(lambda x: T(x, theta), theta * 0.0)


def _fixed_point_fwd(theta):
    x = fixed_point(theta)
    return x, (x, theta)


def _fixed_point_bwd(residuals, g):
    x, theta = residuals
    # the adjoint equation u = g + (dT/dx)^T u, solved by iterating VJPs of T in x
    _, pullback_x = unigrad.vjp(lambda x: T(x, theta), x)
    u = iterate(lambda u: g + pullback_x(u)[0], g)
    _, pullback_theta = unigrad.vjp(lambda theta: T(x, theta), theta)
    return pullback_theta(u)


fixed_point.defvjp(_fixed_point_fwd, _fixed_point_bwd)


def main(backend="numpy"):
    def total(fn):
        return lambda *args: unigrad.namespace(args[0]).sum(fn(*args))

    x = np.array([-1000.0, -1.0, 0.0, 1.0, 1000.0])
    sigmoid = np.exp(-np.logaddexp(0.0, -x))
    values = unigrad.vmap(softplus, backend=backend)(x)  # (inside a transform: float64 on every backend)
    np.testing.assert_allclose(unigrad.to_numpy(values), np.logaddexp(x, 0.0), rtol=1e-15)
    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(total(softplus), backend=backend)(x)), sigmoid,
                               rtol=1e-15)
    hessian = unigrad.to_numpy(unigrad.hessian(total(softplus), backend=backend)(x))
    np.testing.assert_allclose(np.diag(hessian), sigmoid * (1 - sigmoid), rtol=1e-12, atol=1e-300)

    w = np.array([0.2, 0.7, 1.4])
    g = unigrad.grad(lambda w: unigrad.namespace(w).sum((round_ste(w) - 1.0) ** 2), backend=backend)(w)
    np.testing.assert_allclose(unigrad.to_numpy(g), 2 * (np.round(w) - 1.0))  # as if round were the identity

    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(clip_gradient(x, 0.5) ** 3), backend=backend)(w)
    np.testing.assert_allclose(unigrad.to_numpy(g), np.minimum(3 * w ** 2, 0.5))

    theta = np.array([0.3, 0.8, -0.5])
    implicit = unigrad.to_numpy(unigrad.grad(total(fixed_point), backend=backend)(theta))
    unrolled = unigrad.to_numpy(unigrad.grad(total(lambda t: iterate(lambda x: T(x, t), t * 0.0)),
                                             backend=backend)(theta))
    np.testing.assert_allclose(implicit, unrolled, rtol=1e-10)
    print(f"{backend}: softplus, straight-through, clipping and the implicit fixed point agree "
          f"(d sum x*/d theta = {np.round(implicit, 6)})")


if __name__ == "__main__":
    main(*sys.argv[1:])
