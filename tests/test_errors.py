"""Bad input gets a clear error naming the argument, the expected and the actual shape or dtype."""

from __future__ import annotations

import re

import numpy as np
import pytest

import unigrad


def square_sum(x):
    return (x ** 2).sum()


@pytest.mark.parametrize("value", [np.arange(3), np.array([True, False]), 3])
def test_integer_or_bool_input_to_differentiate(value):
    with pytest.raises(TypeError, match=r"argument 0 has dtype (int64|bool); only floating-point or complex"):
        unigrad.grad(square_sum)(value)


def test_integer_input_named_inside_a_pytree():
    with pytest.raises(TypeError, match=r"argument 1\['w'\] has dtype int64"):
        unigrad.grad(lambda a, p: (a * p["w"]).sum(), argnums=(0, 1))(np.ones(2), {"w": np.arange(2)})


def test_integer_primal_in_vjp():
    with pytest.raises(TypeError, match="primal 1 has dtype int64"):
        unigrad.vjp(lambda x, n: x * n, np.ones(2), np.arange(2))


def test_integer_and_bool_outputs():
    with pytest.raises(TypeError, match="output leaf 0 has dtype bool"):
        unigrad.vjp(lambda x: x > 0, np.ones(2))
    with pytest.raises(TypeError, match="output leaf 1 has dtype int64"):
        unigrad.jacobian(lambda x: (x * 2, np.arange(2)))(np.ones(2))


def test_non_array_output():
    with pytest.raises(TypeError, match="must return arrays.*str"):
        unigrad.grad(lambda x: "nope")(np.ones(2))
    with pytest.raises(TypeError, match="returned no arrays"):
        unigrad.grad(lambda x: None)(np.ones(2))


def test_grad_needs_a_scalar():
    with pytest.raises(TypeError, match=r"scalar \(shape \(\)\) output; got shape \(3,\)"):
        unigrad.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(TypeError, match="real-valued output; got dtype complex128"):
        unigrad.grad(lambda z: (z * z).sum())(np.ones(2, complex))


@pytest.mark.parametrize("argnums", [2, -3, (0, 2)])
def test_argnums_out_of_range(argnums):
    with pytest.raises(ValueError, match=re.escape(f"argnums={argnums!r} is out of range for a function called "
                                                   f"with 2 positional arguments")):
        unigrad.grad(lambda x, y: (x * y).sum(), argnums=argnums)(np.ones(2), np.ones(2))


@pytest.mark.parametrize("argnums", [1.0, (), (0, 0), True, "0"])
def test_argnums_malformed(argnums):
    with pytest.raises((TypeError, ValueError), match="argnums"):
        unigrad.grad(lambda x, y: (x * y).sum(), argnums=argnums)(np.ones(2), np.ones(2))


def test_cotangent_of_wrong_shape_is_never_broadcast():
    _, vjp_fn = unigrad.vjp(lambda x: x * 2, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"has shape \(3,\); expected \(2, 3\).*never broadcast"):
        vjp_fn(np.ones(3))
    with pytest.raises(ValueError, match=r"has shape \(\); expected \(2, 3\)"):
        vjp_fn(1.0)


def test_cotangent_dtype_policy():
    _, vjp_fn = unigrad.vjp(lambda x: x * 2, np.ones(2, np.float32))
    g = vjp_fn(np.ones(2, np.float64))  # a floating cotangent is cast to the output's dtype
    assert g[0].dtype == np.float32
    with pytest.raises(ValueError, match="has dtype int64; expected float32"):
        vjp_fn(np.ones(2, np.int64))
    with pytest.raises(ValueError, match="has dtype complex128; expected float32"):
        vjp_fn(np.ones(2, complex))


def test_cotangent_structure_mismatch():
    _, vjp_fn = unigrad.vjp(lambda x: {"a": x, "b": x}, np.ones(2))
    with pytest.raises(ValueError, match="structure of the output"):
        vjp_fn(np.ones(2))


def test_tangent_shape_dtype_and_structure():
    with pytest.raises(ValueError, match=r"tangent for primal 0 has shape \(2,\); expected \(3,\)"):
        unigrad.jvp(square_sum, (np.ones(3),), (np.ones(2),))
    with pytest.raises(ValueError, match="has dtype bool"):
        unigrad.jvp(square_sum, (np.ones(3),), (np.ones(3, bool),))
    with pytest.raises(ValueError, match="same length"):
        unigrad.jvp(square_sum, (np.ones(3),), ())
    with pytest.raises(TypeError, match="tuples or lists"):
        unigrad.jvp(square_sum, np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match=r"tangent for primal 0 has shape \(2,\); expected \(3,\)"):
        unigrad.hvp(square_sum, (np.ones(3),), (np.ones(2),))


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; available backends: .*numpy"):
        unigrad.grad(square_sum, backend="nope")(np.ones(2))
    with pytest.raises(ValueError, match="unknown backend"):
        unigrad.get_backend("nope")


def test_unknown_backend_with_an_extra_suggests_it(monkeypatch):
    from unigrad import _registry

    monkeypatch.setattr(_registry, "_discover", lambda: {})
    monkeypatch.setattr(_registry, "_instances", {})  # as on a machine where jax was never installed
    with pytest.raises(ValueError, match=r"pip install 'unigrad\[jax\]'"):
        _registry.get_backend("jax")


def test_bad_mode_and_chunk_size():
    with pytest.raises(ValueError, match="mode must be one of"):
        unigrad.jacobian(square_sum, mode="sideways")
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        unigrad.jacobian(square_sum, chunk_size=0)
    with pytest.raises(ValueError, match="check_independence"):
        unigrad.batched_jacobian(square_sum, check_independence="sometimes")


def test_has_aux_must_return_a_pair():
    with pytest.raises(TypeError, match=r"has_aux=True the function must return a pair"):
        unigrad.grad(square_sum, has_aux=True)(np.ones(2))


def test_unsupported_argument_type():
    with pytest.raises(TypeError, match="argument 0 must be an array or a Python scalar; got object"):
        unigrad.grad(square_sum)(object())


def test_leaked_tracer_is_an_error():
    kept = []

    def f(x):
        kept.append(x * 2)
        return (x ** 2).sum()

    unigrad.grad(f)(np.ones(2))
    from unigrad.tape._core import LeakedTracerError

    with pytest.raises(LeakedTracerError, match="finished unigrad transform"):
        unigrad.grad(lambda y: (kept[0] * y).sum())(np.ones(2))


def test_converting_a_traced_value_to_numpy_is_an_error():
    with pytest.raises(TypeError, match="cannot be converted to a NumPy array"):
        unigrad.grad(lambda x: np.asarray(x).sum())(np.ones(2))


def test_argnums_checks_are_not_skipped_after_a_valid_call():
    f = unigrad.grad(lambda x, y: (x * y).sum(), argnums=1)
    f(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="argnums"):
        unigrad.grad(lambda x, y: (x * y).sum(), argnums=True)(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="argnums"):
        unigrad.grad(lambda x, y: (x * y).sum(), argnums=(True,))(np.ones(2), np.ones(2))


# ------------------------------------------------------------------------------ the common mistakes, on every backend

import importlib.util  # noqa: E402

_ALL = ["numpy"] + [n for n, m in (("torch", "torch"), ("jax", "jax"), ("tensorflow", "tensorflow"))
                    if importlib.util.find_spec(m) is not None]


def _portable_loss(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) ** 2)


@pytest.mark.parametrize("name", _ALL)
def test_a_list_argument_gets_one_message_on_every_backend(name):
    with pytest.raises(TypeError) as info:
        unigrad.grad(_portable_loss, backend=name)([1.0, 2.0, 3.0])
    message = str(info.value)
    assert "argument 0 is a list (a pytree of 3 scalars" in message and "np.asarray([...])" in message, message


@pytest.mark.parametrize("name", [n for n in _ALL if n != "numpy"])
def test_numpy_functions_on_traced_values_name_the_portable_spelling(name):
    with pytest.raises(TypeError, match=r"converted a traced value to NumPy .* xp = unigrad.namespace\(x\)"):
        unigrad.grad(lambda x: unigrad.namespace(x).sum(np.sin(x)), backend=name)(np.ones(3))


@pytest.mark.parametrize("name", _ALL)
def test_has_aux_messages_show_no_internal_types(name):
    with pytest.raises(TypeError) as info:
        unigrad.grad(lambda x: unigrad.namespace(x).sum(x), has_aux=True, backend=name)(np.ones(3))
    assert "Tracer" not in str(info.value) and "an array of shape ()" in str(info.value), str(info.value)
    with pytest.raises(TypeError, match="has_aux=True"):  # the usual reason a gradient's f returns a pair
        unigrad.grad(lambda x: (unigrad.namespace(x).sum(x), x), backend=name)(np.ones(3))


def test_chunk_size_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="chunk_size must be a positive int or None; got str 'a'"):
        unigrad.jacobian(square_sum, chunk_size="a")
    with pytest.raises(TypeError, match="chunk_size"):
        unigrad.batched_jacobian(square_sum, chunk_size=2.0)


@pytest.mark.parametrize("typo, meant", [("pytorch", "torch"), ("Torch", "torch"), ("tf", "tensorflow"),
                                         ("nmupy", "numpy"), ("jaxx", "jax")])
def test_backend_name_typos_say_did_you_mean(typo, meant):
    with pytest.raises(ValueError, match=rf"unknown backend '{typo}' \(did you mean '{meant}'\?\)"):
        unigrad.get_backend(typo)


@pytest.mark.skipif("torch" not in _ALL, reason="torch not installed")
def test_a_closed_over_numpy_array_on_torch_says_what_to_do():
    data = np.arange(3.0)
    with pytest.raises(TypeError, match=r"combines a NumPy array with the torch backend's arrays .* argument"):
        unigrad.grad(lambda w: unigrad.namespace(w).sum(data * w), backend="torch")(np.ones(3))
    # passed as an argument, it is converted
    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(lambda w, d: unigrad.namespace(w).sum(d * w),
                                                             backend="torch")(np.ones(3), data)), data)


@pytest.mark.parametrize("bk", ["numpy", "torch", "jax", "tensorflow"])
def test_batched_jacobian_with_respect_to_parameters_points_to_per_example_grad(bk):
    """An argument without the batch axis (shared parameters) differentiated by batched_jacobian: on the tape the
    output's batch size gives it away, on torch, JAX and TensorFlow the proof that their product mixes 'rows' of
    the parameters; every backend's error says where per-example gradients are."""
    if bk != "numpy":
        pytest.importorskip(bk)

    def layer(w, x):
        xp = unigrad.namespace(w, x)
        return xp.tanh(x @ w)

    with pytest.raises(ValueError, match=r"unigrad\.per_example_grad\(f, argnums=\.\.\., batch_argnum=\.\.\.\)"):
        unigrad.batched_jacobian(layer, argnums=0, backend=bk)(np.ones((3, 2)), np.ones((4, 3)))
    with pytest.raises(ValueError) as mixed:  # rows truly mixed, every array batched alike: no such hint
        unigrad.batched_jacobian(lambda x: x - unigrad.namespace(x).mean(x, axis=0), backend=bk)(np.ones((4, 3)))
    assert "unigrad.per_example_grad" not in str(mixed.value)
