"""The examples of derivatives of solutions (issue 39) on every backend: a deep-equilibrium layer trained with the
same losses everywhere, a bilevel hyperparameter gradient against finite differences, and 100 root problems under
vmap against their closed form. Each script's functions are run here one backend per case; the NumPy tape's run is
the reference the others are held to, and it is held itself to independent truths (the unrolled iterations' gradient,
finite differences, closed forms)."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import numpy as np
import pytest

import unigrad

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Moved to the thorough job (conftest's SLOW_CASES): eager JAX traces each new function's nested transforms
# (5 to 8 s a case on the 2-core CI machine), TensorFlow's eager rules take 2 to 5 s a case, and batched_jacobian
# over the 100 problems 5 to 20 s on both (a dense 100 x 100 optimality Jacobian and the answer check per call).
# The default run keeps every case on the tape, torch, MLX and the autograd plugin, and vmap(grad) on JAX.
SLOW_CASES = {"test_deep_equilibrium_trains_with_the_same_losses[jax]",
              "test_deep_equilibrium_trains_with_the_same_losses[tensorflow]",
              "test_bilevel_outer_steps_agree_across_backends[jax]",
              "test_bilevel_outer_steps_agree_across_backends[tensorflow]",
              "test_batched_roots_against_the_closed_form[jax-batched_jacobian]",
              "test_batched_roots_against_the_closed_form[tensorflow-batched_jacobian]",
              "test_batched_roots_against_the_closed_form[tensorflow-vmap_grad]"}


@functools.cache
def _example(name):
    return runpy.run_path(str(EXAMPLES / name), run_name="example")


def _float64(backend):
    return unigrad.get_backend(backend).capabilities.float64


def _run_or_skip(backend, fn, *args):
    """fn(*args); a backend that refuses (an error, never a number) is skipped with its error as the reason."""
    try:
        return fn(*args)
    except NotImplementedError as error:  # the implicit rules' refusal where nested derivatives are not available
        pytest.skip(f"{backend} refuses: NotImplementedError: {str(error).splitlines()[0]}")


@functools.cache
def _deq_reference():
    return _example("deep_equilibrium.py")["train"]("numpy")


def test_deep_equilibrium_gradient_is_the_unrolled_one_and_finite_differences():
    """The implicit gradient on the tape against differentiating all 80 iterations, and a central difference."""
    unrolled, fd = _example("deep_equilibrium.py")["check_gradient"](_deq_reference()[1])
    assert unrolled < 1e-9 and fd < 1e-7
    losses = _deq_reference()[0]
    assert losses[-1] < 0.5 * losses[0]  # it trains


def test_deep_equilibrium_trains_with_the_same_losses(backend):
    """Five gradient steps on each backend: the same losses and the same first gradient as the NumPy tape."""
    losses, first = _run_or_skip(backend, _example("deep_equilibrium.py")["train"], backend)
    want_losses, want_first = _deq_reference()
    rtol = 1e-11 if _float64(backend) else 1e-5
    np.testing.assert_allclose(losses, want_losses, rtol=rtol)
    for k in want_first:
        np.testing.assert_allclose(first[k], want_first[k], rtol=rtol * 10, atol=rtol * 1e-2, err_msg=k)


def test_deep_equilibrium_would_catch_a_wrong_gradient():
    """The example's cross-check can fail: a fixed point of another map (W scaled) gives other gradients."""
    deq = _example("deep_equilibrium.py")
    params, x, y = deq["problem"]()
    wrong = unigrad.custom_fixed_point(lambda z, w, u, b, x: deq["layer_map"](z, 0.9 * w, u, b, x))(
        lambda init, w, u, b, x: deq["iterate"](init, 0.9 * w, u, b, x))
    g = unigrad.grad(lambda p: deq["loss"](p, x, y, solver=wrong))(params)
    with pytest.raises(AssertionError):
        deq["check_gradient"](g)


@functools.cache
def _bilevel_reference():
    return _example("bilevel_logistic.py")["outer_descent"]("numpy")


def test_bilevel_hypergradient_against_finite_differences():
    bilevel = _example("bilevel_logistic.py")
    history = _bilevel_reference()
    for t, _, g in history:
        fd = bilevel["finite_difference"](t)
        assert abs(g - fd) <= 1e-8 * abs(fd), (t, g, fd)
    assert history[-1][1] < history[0][1] - 1e-3  # the outer steps lower the validation loss


def test_bilevel_outer_steps_agree_across_backends(backend):
    history = _run_or_skip(backend, _example("bilevel_logistic.py")["outer_descent"], backend)
    np.testing.assert_allclose(np.array(history), np.array(_bilevel_reference()),
                               rtol=1e-10 if _float64(backend) else 1e-4)


@pytest.mark.parametrize("how", ["vmap_grad", "batched_jacobian"])
def test_batched_roots_against_the_closed_form(backend, how):
    """100 cubics x^3 + a x - b = 0: dx/da = -x / (3x^2 + a), dx/db = 1 / (3x^2 + a), per problem."""
    roots = _example("batched_roots.py")
    p = roots["problems"]()
    _, want = roots["closed_form"](p)
    if how == "vmap_grad":
        one = lambda p: unigrad.namespace(p).sum(roots["root"](p))  # noqa: E731
        fn = unigrad.vmap(unigrad.grad(one, backend=backend), backend=backend)
    else:
        fn = unigrad.batched_jacobian(roots["root"], backend=backend)
    got = np.asarray(unigrad.to_numpy(_run_or_skip(backend, fn, p))).reshape(want.shape)
    rtol = 1e-9 if _float64(backend) else 1e-4
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-2)


def test_batched_roots_closed_form_is_independent():
    """The closed form's roots (NumPy's polynomial roots) are the cubics' roots, and Newton's agree."""
    roots = _example("batched_roots.py")
    p = roots["problems"]()
    x, want = roots["closed_form"](p)
    np.testing.assert_allclose(x ** 3 + p[:, 0] * x - p[:, 1], 0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(roots["root"](p))[:, 0], x, rtol=1e-10, atol=1e-12)
    h = 1e-6  # and the closed-form derivative is the roots' finite difference
    fd_b = (roots["closed_form"](p + [0, h])[0] - roots["closed_form"](p - [0, h])[0]) / (2 * h)
    np.testing.assert_allclose(fd_b, want[:, 1], rtol=1e-6)


@pytest.mark.parametrize("script", ["deep_equilibrium.py", "bilevel_logistic.py", "batched_roots.py"])
def test_the_scripts_run_and_report(script, capsys):
    """Each script's main (its own asserts) on the NumPy tape: one line, naming the backend."""
    results, left_out = _example(script)["main"](["numpy"])
    assert set(results) == {"numpy"} and not left_out
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["numpy"]
