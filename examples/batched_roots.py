"""A batch of 100 small root problems, differentiated at once: ``vmap`` of an implicit gradient.

Each problem is the real root of the cubic ``x^3 + a x - b = 0`` (``a > 0``: one real root), found
by Newton's method as plain code and wrapped in ``unigrad.custom_root``. By the implicit function
theorem ``dx/db = 1 / (3 x^2 + a)`` and ``dx/da = -x / (3 x^2 + a)``: the closed forms the results
are checked against.

Two ways over the batch of 100 parameter pairs ``(a, b)``:

- ``unigrad.vmap(unigrad.grad(root_of_one_problem))``: the gradient of one problem, mapped;
- ``unigrad.batched_jacobian(roots_of_the_batch)``: the per-problem Jacobians of a function of the
  whole batch.

Inside ``vmap`` the derivative's linear systems have no values to steer an iterative solver by, so
they are materialised and solved densely (docs/implicit.md). ``main()`` runs both on every installed
backend and asserts the closed forms; a backend whose linear algebra has no batching rule (MLX's
``linalg.solve`` under ``vmap`` at the time of writing) raises -- reported as left out with its
error, never a wrong number.

Run it:  python examples/batched_roots.py
"""

from __future__ import annotations

import numpy as np

import unigrad

PROBLEMS, NEWTON_STEPS = 100, 40


def cubic(x, p):
    """The optimality condition of one problem (or of a batch, row by row): x^3 + a x - b."""
    return x ** 3 + p[..., 0:1] * x - p[..., 1:2]


@unigrad.custom_root(cubic, solve="lu")
def newton(init, p):
    """Newton's method, plain code: x <- x - f(x) / f'(x), from ``init`` (the cubic is monotone for a > 0)."""
    x = init
    for _ in range(NEWTON_STEPS):
        x = x - cubic(x, p) / (3 * x ** 2 + p[..., 0:1])
    return x


def root(p):
    """The root(s) of the problem(s) ``p`` (shape (2,) or (batch, 2)), shape (1,) or (batch, 1)."""
    xp = unigrad.namespace(p)
    return newton(xp.zeros(p.shape[:-1] + (1,), dtype=p.dtype), p)


def problems(n=PROBLEMS, seed=0):
    """n parameter pairs (a, b), a in [0.5, 3], b in [-5, 5] (NumPy float64)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.uniform(0.5, 3.0, n), rng.uniform(-5.0, 5.0, n)], axis=1)


def closed_form(p):
    """(x, [dx/da, dx/db]) of each problem, x from NumPy's polynomial roots (independent of Newton)."""
    x = np.array([next(r.real for r in np.roots([1.0, 0.0, a, -b]) if abs(r.imag) < 1e-9) for a, b in p])
    slope = 3 * x ** 2 + p[:, 0]
    return x, np.stack([-x / slope, 1 / slope], axis=1)


def derivatives(backend, p):
    """The per-problem gradients of the root in (a, b), by vmap of grad and by batched_jacobian (NumPy)."""
    one = lambda p: unigrad.namespace(p).sum(root(p))  # noqa: E731  (one problem: a scalar)
    mapped = unigrad.vmap(unigrad.grad(one, backend=backend), backend=backend)(p)
    per_problem = unigrad.batched_jacobian(root, backend=backend)(p)  # (batch, 1, 2)
    return np.asarray(unigrad.to_numpy(mapped)), np.asarray(unigrad.to_numpy(per_problem)).reshape(len(p), 2)


def main(backends=None):
    """Run on ``backends`` (names; default every installed backend): {name: result}, {name: why it was left out}."""
    p = problems()
    x, want = closed_form(p)
    np.testing.assert_allclose(unigrad.to_numpy(root(p))[:, 0], x, rtol=1e-10, atol=1e-12)
    installed = backends or [name for name, info in unigrad.backends().items() if info["available"]]
    results, left_out = {}, {}
    for name in sorted(installed, key=lambda n: n != "numpy"):  # the NumPy tape first
        try:
            mapped, per_problem = derivatives(name, p)
        except Exception as error:  # an error names what has no batching rule; a wrong number is never let through
            left_out[name] = f"{type(error).__name__}: {error}"
            print(f"{name:>10}: left out: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            continue
        rtol = 1e-9 if unigrad.get_backend(name).capabilities.float64 else 1e-4
        np.testing.assert_allclose(mapped, want, rtol=rtol, atol=rtol * 1e-2, err_msg=f"{name}: vmap(grad)")
        np.testing.assert_allclose(per_problem, want, rtol=rtol, atol=rtol * 1e-2, err_msg=f"{name}: batched_jacobian")
        results[name] = (mapped, per_problem)
        worst = max(float(np.max(np.abs(m - want) / np.abs(want))) for m in (mapped, per_problem))
        print(f"{name:>10}: {len(p)} problems, dx/da and dx/db by vmap(grad) and batched_jacobian; "
              f"max relative error against 1/(3x^2+a): {worst:.1e}")
    return results, left_out


if __name__ == "__main__":
    main()
