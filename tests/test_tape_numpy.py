"""Plain NumPy code on the tape (issue 8 §2): NumPy's own functions on traced values.

The rule: a NumPy function the tape accepts on a traced value gives NumPy's own value and its
derivative for every argument NumPy accepts, or raises a TypeError naming the function and the
argument. One table drives the checks: the value traced (inside ``jvp``) equals NumPy's, and
``check_grads`` (finite differences, both modes) passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import skip_unless

import unigrad
from unigrad.testing import check_grads

RNG = np.random.default_rng(7)
A = RNG.standard_normal((4, 4))  # not symmetric
SPD = A @ A.T + 4 * np.eye(4)
V3 = RNG.standard_normal((4, 3))
W3 = RNG.standard_normal((4, 3))
M = RNG.standard_normal((2, 3))
X6 = RNG.standard_normal(6)
POS = RNG.uniform(0.5, 2.0, (2, 3))
CPLX = RNG.standard_normal(5) + 1j * RNG.standard_normal(5)


def traced(f, *args):
    """f's output when its arguments are traced by the tape."""
    return unigrad.jvp(f, args, tuple(np.zeros_like(a) for a in args), backend="numpy")[0]


def total(f):
    """A real scalar of all of f's outputs (check_grads wants one output array per call)."""
    def g(*args):
        out = f(*args)
        parts = out if isinstance(out, (tuple, list)) else (out,)
        return sum(np.sum(np.real(p) * np.arange(1, np.size(p) + 1).reshape(np.shape(p))) for p in parts)
    return g


CASES = {
    # the repros of numpy_dispatch_repros.py
    "eigvalsh": (lambda a: np.linalg.eigvalsh(a), (A,)),
    "eigvalsh_U": (lambda a: np.linalg.eigvalsh(a, UPLO="U"), (A,)),
    "eigh_U_values": (lambda a: np.linalg.eigh(a, UPLO="U")[0], (A,)),
    "cholesky_lower_triangle": (lambda a: np.linalg.cholesky(a + np.triu(np.ones((4, 4)), 1)), (SPD,)),
    "cholesky_upper": (lambda a: np.linalg.cholesky(a + np.tril(np.ones((4, 4)), -1), upper=True), (SPD,)),
    "cross_axisc": (lambda a, b: np.cross(a, b, axisc=0), (V3, W3)),
    "cross_axisa_axisb": (lambda a, b: np.cross(a.T, b, axisa=0, axisb=1), (V3, W3)),
    "cross_2d_vectors": (lambda a, b: np.cross(a[:, :2], b[:, :2]), (V3, W3)),
    "cross_2d_and_3d": (lambda a, b: np.cross(a[:, :2], b), (V3, W3)),
    "reshape_F": (lambda a: np.reshape(a, (3, 2), order="F"), (M,)),
    "ravel_F": (lambda a: np.ravel(a, order="F"), (M,)),
    "method_reshape_F": (lambda a: a.reshape((3, 2), order="F"), (M,)),
    "einsum_sublist": (lambda a: np.einsum(a, [0, 1], [1, 0]), (M,)),
    "einsum_sublist_two": (lambda a, b: np.einsum(a, [0, 1], b, [1, 2], [0, 2]), (M, V3.T)),
    "moveaxis_keywords": (lambda a: np.moveaxis(a, source=0, destination=1), (M,)),
    "swapaxes_keywords": (lambda a: np.swapaxes(a, axis1=0, axis2=1), (M,)),
    # the widened surface
    "split": (lambda a: np.split(a, 3), (X6,)),
    "split_indices": (lambda a: np.split(a, [1, 4]), (X6,)),
    "array_split": (lambda a: np.array_split(a, 4), (X6,)),
    "hsplit": (lambda a: np.hsplit(a, 3), (M,)),
    "vsplit": (lambda a: np.vsplit(a, 2), (M,)),
    "deg2rad_rad2deg": (lambda a: np.deg2rad(a) + np.rad2deg(a), (M,)),
    "angle": (lambda z: np.angle(z, deg=True), (CPLX,)),
    "angle_real": (lambda a: np.angle(a), (X6,)),
    "append": (lambda a, b: np.append(a, b), (M, X6)),
    "append_axis": (lambda a, b: np.append(a, b, axis=0), (M, POS)),
    "exp2": (lambda a: np.exp2(a), (M,)),
    "gradient": (lambda a: np.gradient(a), (X6,)),
    "gradient_2d_spacing": (lambda a: np.gradient(a, 0.5, edge_order=2), (RNG.standard_normal((3, 4)),)),
    "gradient_coordinates": (lambda a: np.gradient(a, np.array([0.0, 0.5, 1.5, 1.7, 3.0, 4.0])), (X6,)),
    "column_stack": (lambda a, b: np.column_stack([a, b]), (X6, np.arange(6.0))),
    "fliplr_flipud": (lambda a: np.fliplr(a) + np.flipud(a), (M,)),
    "rot90": (lambda a: np.rot90(a), (M,)),
    "rot90_k3": (lambda a: np.rot90(a, k=3), (M,)),
    "rot90_k2": (lambda a: np.rot90(a, 2), (M,)),
    "fabs": (lambda a: np.fabs(a), (X6,)),
    "fmax_fmin": (lambda a, b: np.fmax(a, b) + np.fmin(a, b) * 2, (M, POS)),
    "logaddexp2": (lambda a, b: np.logaddexp2(a, b), (M, POS)),
    "sinc": (lambda a: np.sinc(a), (np.array([0.0, 1e-4, -3e-3, 0.02, 0.5, -1.7]),)),
    "nan_to_num": (lambda a: np.nan_to_num(a, posinf=5.0, neginf=-7.0, nan=0.5), (X6,)),
    "nan_to_num_defaults": (lambda a: np.nan_to_num(a * np.array([1.0, np.nan, np.inf, -np.inf, 2.0, 3.0])),
                            (X6,)),
    "nan_to_num_complex": (lambda z: np.nan_to_num(z * np.array([1, np.nan, np.inf, 1j * np.inf, 2])), (CPLX,)),
    "kron": (lambda a, b: np.kron(a, b), (M, POS[:1, :2])),
    "kron_1d_2d": (lambda a, b: np.kron(a, b), (X6[:3], M)),
    "pad_constant": (lambda a: np.pad(a, ((1, 0), (2, 1)), constant_values=((0.5, 1.5), (2.0, 3.0))), (M,)),
    "pad_edge": (lambda a: np.pad(a, 2, mode="edge"), (M,)),
    "pad_reflect": (lambda a: np.pad(a, (1, 2), mode="reflect"), (M,)),
    "pad_symmetric": (lambda a: np.pad(a, ((0, 2), (1, 1)), mode="symmetric"), (M,)),
    "pad_wrap": (lambda a: np.pad(a, 3, mode="wrap"), (X6,)),
    "partition": (lambda a: np.partition(a, 2), (X6,)),
    "partition_axis0": (lambda a: np.partition(a, 1, axis=0), (POS.T,)),
    "select": (lambda a: np.select([a > 0.5, a < -0.5], [a * 2, a ** 2], default=-1.0), (X6,)),
    "linspace": (lambda a, b: np.linspace(a, b, 5), (M, POS)),
    "linspace_no_endpoint_axis": (lambda a, b: np.linspace(a, b, 4, endpoint=False, axis=1), (M, POS)),
    "var_std_ddof_correction": (lambda a: np.var(a, ddof=1) + np.std(a, axis=0, correction=1), (M,)),
    "sum_keepdims": (lambda a: np.sum(a, axis=1, keepdims=True), (M,)),
    "concatenate_dtype": (lambda a, b: np.concatenate([a, b], axis=None, dtype=np.float64),
                          (M.astype(np.float32), POS.astype(np.float32))),
    "take_wrap": (lambda a: np.take(a, [7, -1, 2], mode="wrap"), (X6,)),
    "take_clip": (lambda a: np.take(a, [7, -1, 2], mode="clip"), (X6,)),
    "diff_prepend_scalar": (lambda a: np.diff(a, prepend=0.5, append=a[:, :1]), (M,)),
    "round_decimals": (lambda a: np.round(a * 3, 1) + a, (M,)),
    "vdot": (lambda a, b: np.vdot(a, b), (M, POS)),
    "float_power": (lambda a: np.float_power(a, 2), (POS.astype(np.float32),)),
    "svd_values": (lambda a: np.linalg.svd(a, compute_uv=False), (M,)),
    "qr_r": (lambda a: np.abs(np.linalg.qr(a, mode="r")), (A,)),
    "eigvals_complex": (lambda a: np.linalg.eigvals(a) ** 2, (A,)),
    "eigvals_real": (lambda a: np.linalg.eigvals(a), (SPD,)),
    "eig_reconstruction": (lambda a: (np.linalg.eig(a)[1] * np.linalg.eig(a)[0]) @ np.linalg.inv(np.linalg.eig(a)[1]),
                           (A,)),
    "eig_vector_moduli": (lambda a: np.abs(np.linalg.eig(a).eigenvectors), (A,)),
    "eigvals_of_complex": (lambda z: np.linalg.eigvals(z), (A + 1j * SPD,)),
}

CHECK_ONLY_VALUE = {"partition", "partition_axis0", "round_decimals", "nan_to_num_defaults", "nan_to_num_complex"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_is_numpys(name):
    f, args = CASES[name]
    got, want = traced(f, *args), f(*args)
    for g, w in zip(got if isinstance(want, (tuple, list)) else (got,),
                    want if isinstance(want, (tuple, list)) else (want,)):
        assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype, (np.shape(g), np.shape(w))
        np.testing.assert_allclose(g, w, rtol=1e-12 if np.asarray(w).dtype == np.float64 else 1e-6, atol=1e-14)


@pytest.mark.parametrize("name", sorted(set(CASES) - CHECK_ONLY_VALUE))
def test_derivative_matches_finite_differences(name):
    f, args = CASES[name]
    check_grads(total(f), args, order=1, backend="numpy")


def test_nan_to_num_derivative_is_zero_where_it_replaces():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    g = unigrad.grad(lambda a: np.sum(np.nan_to_num(a, posinf=5.0) * 3), backend="numpy")(x)
    np.testing.assert_array_equal(g, [3, 0, 0, 0, 3])


def test_partition_derivative_follows_its_permutation():
    x = X6
    g = unigrad.grad(lambda a: np.sum(np.partition(a, 2)[:3] ** 2), backend="numpy")(x)
    smallest = np.argsort(x)[:3]
    want = np.zeros(6)
    want[smallest] = 2 * x[smallest]
    np.testing.assert_allclose(g, want)


def test_sinc_second_derivative_at_zero():
    h = unigrad.hessian(lambda a: np.sum(np.sinc(a)), backend="numpy")(np.array([0.0, 0.004]))
    np.testing.assert_allclose(np.diag(h)[0], -np.pi ** 2 / 3, rtol=1e-12)
    check_grads(lambda a: np.sinc(a), (np.array([0.0, 0.004, 0.3]),), order=2, backend="numpy")


def test_numpys_triangle_rule_gives_derivatives_only_to_the_triangle_read():
    for uplo, other in (("L", np.triu), ("U", np.tril)):
        g = unigrad.grad(lambda a: np.sum(np.linalg.eigvalsh(a, UPLO=uplo) ** 3), backend="numpy")(A)
        assert np.all(other(g, 1 if uplo == "L" else -1) == 0) and np.all(g != 0 + other(np.ones((4, 4)), 1 if uplo == "L" else -1))
        g = unigrad.grad(lambda a: np.sum(np.linalg.cholesky(a, upper=uplo == "U")), backend="numpy")(SPD)
        assert np.all(other(g, 1 if uplo == "L" else -1) == 0)


@pytest.mark.parametrize("call, names", [
    (lambda a: np.sum(a, where=a > 0), ["np.sum", "where"]),
    (lambda a: np.max(a, initial=3.0), ["np.max", "initial"]),
    (lambda a: np.var(a, mean=np.mean(a)), ["np.var", "mean"]),
    (lambda a: np.ravel(a.T[:, ::-1], order="K"), ["np.ravel", "order"]),
    (lambda a: np.pad(a, 1, mode="mean"), ["np.pad", "mode"]),
    (lambda a: np.pad(a, 1, mode="reflect", reflect_type="odd"), ["np.pad", "reflect_type"]),
    (lambda a: np.linalg.svd(a, hermitian=True), ["np.linalg.svd", "hermitian"]),
    (lambda a: np.concatenate([a, a], casting="unsafe"), ["np.concatenate", "casting"]),
    (lambda a: np.einsum("ij->i", a, order="C"), ["np.einsum", "order"]),
    (lambda a: np.linalg.qr(a, mode="raw"), ["np.linalg.qr", "mode"]),
], ids=["sum_where", "max_initial", "var_mean", "ravel_K", "pad_mean", "pad_odd", "svd_hermitian",
        "concatenate_casting", "einsum_order", "qr_raw"])
def test_unsupported_arguments_raise_naming_function_and_argument(call, names):
    x = M[:, :2] @ M[:, :2].T + np.eye(2)
    with pytest.raises(TypeError) as info:
        traced(call, x)
    for n in names:
        assert n in str(info.value)


def test_float_int_complex_of_a_traced_value_raise_and_bool_works():
    def f(a):
        s = np.sum(a)
        if s > 0:  # control flow on a comparison: fine
            s = s * 2
        return s + bool(a[0] > 0)
    np.testing.assert_allclose(unigrad.grad(f, backend="numpy")(np.array([1.0, 2.0])), [2.0, 2.0])
    for conv in (float, int, complex):
        with pytest.raises(TypeError, match=f"{conv.__name__}\\(\\) of a traced array"):
            unigrad.grad(lambda a: np.sum(a) * conv(a[0]), backend="numpy")(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="traced array"):
        unigrad.grad(lambda a: np.sum(a) * [1.0, 2.0][a[0].__index__()], backend="numpy")(np.array([1.0, 2.0]))


@pytest.mark.parametrize("fname", ["var", "std", "sum", "mean", "prod", "max", "min"])
def test_statistics_of_a_python_float(fname):
    xp = unigrad.namespace(np.zeros(()))
    np.testing.assert_allclose(getattr(xp, fname)(3.5), getattr(np, fname)(3.5))


def test_ufunc_table_is_the_rule_table():
    from unigrad.tape import _numpy_dispatch as D
    from unigrad.tape import _primitives as P
    for p in P.PRIMITIVES.values():
        if p.ufunc is not None:
            assert D.UFUNCS[p.ufunc] is p


# ------------------------------------------------------------------------------------------ fft

Z = RNG.standard_normal((3, 6)) + 1j * RNG.standard_normal((3, 6))
ZH = RNG.standard_normal((3, 4)) + 1j * RNG.standard_normal((3, 4))
R36 = RNG.standard_normal((3, 6))

FFT_CASES = {
    "fft": (lambda a: np.fft.fft(a), (Z,)),
    "fft_real_padded": (lambda a: np.fft.fft(a, n=8, axis=0), (R36,)),
    "ifft_cropped_ortho": (lambda a: np.fft.ifft(a, n=4, norm="ortho"), (Z,)),
    "rfft": (lambda a: np.fft.rfft(a), (R36,)),
    "rfft_n_forward": (lambda a: np.fft.rfft(a, n=5, norm="forward", axis=0), (R36,)),
    "irfft": (lambda a: np.fft.irfft(a), (ZH,)),
    "irfft_odd_ortho": (lambda a: np.fft.irfft(a, n=7, norm="ortho"), (ZH,)),
    "hfft": (lambda a: np.fft.hfft(a), (ZH,)),
    "ihfft": (lambda a: np.fft.ihfft(a), (R36,)),
    "fft2": (lambda a: np.fft.fft2(a), (Z,)),
    "rfftn": (lambda a: np.fft.rfftn(a), (R36,)),
    "irfft2": (lambda a: np.fft.irfft2(a, s=(3, 6)), (ZH,)),
    "ifftn_axes": (lambda a: np.fft.ifftn(a, axes=(0,)), (Z,)),
    "shifts": (lambda a: np.fft.fftshift(a) + np.fft.ifftshift(a, axes=1), (R36,)),
    "namespace_rfft_float32": (lambda a: unigrad.namespace(a).fft.rfft(a), (R36.astype(np.float32),)),
}


@pytest.mark.parametrize("name", sorted(FFT_CASES))
def test_fft_value_and_derivatives(name):
    f, args = FFT_CASES[name]
    got, want = traced(f, *args), f(*args) if "namespace" not in name else np.fft.rfft(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if want.dtype == np.complex64 else 1e-12, atol=1e-12)
    check_grads(f, args, order=2, backend="numpy")


@pytest.mark.parametrize("name", ["rfft", "irfft", "fft"])
def test_fft_vjp_against_jax(name):
    jax = skip_unless("jax")
    jnp = jax.numpy
    x = {"rfft": R36[0], "irfft": ZH[0], "fft": Z[0]}[name].astype(np.complex64 if name != "rfft" else np.float32)
    f_np, f_jax = getattr(np.fft, name), getattr(jnp.fft, name)
    out, vjp_fn = unigrad.vjp(f_np, x, backend="numpy")
    ct = (RNG.standard_normal(out.shape) + (1j * RNG.standard_normal(out.shape) if np.iscomplexobj(out) else 0)
          ).astype(out.dtype)
    want = jax.vjp(f_jax, jnp.asarray(x))[1](jnp.asarray(ct))[0]
    np.testing.assert_allclose(vjp_fn(ct)[0], np.asarray(want), rtol=2e-5, atol=2e-5)


def test_eigvals_vjp_against_jax():
    jax = skip_unless("jax")
    a = A.astype(np.float32)
    out, vjp_fn = unigrad.vjp(np.linalg.eigvals, a, backend="numpy")
    ct = (RNG.standard_normal(4) + 1j * RNG.standard_normal(4)).astype(np.complex64)
    w, pullback = jax.vjp(jax.numpy.linalg.eigvals, jax.numpy.asarray(a))
    order = [int(np.argmin(np.abs(np.asarray(w) - o))) for o in out]  # LAPACK may order them differently
    want = pullback(jax.numpy.asarray(ct[np.argsort(order)]))[0]
    np.testing.assert_allclose(vjp_fn(ct)[0], np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_square_is_numpys_own_x_squared(dtype):
    """``x ** 2`` traced is NumPy's ``x ** 2`` to the bit (its square, not ``np.power``, which for complex
    input goes through exp/log and differs in the last bits), and its derivative is 2 x."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(2000) * np.exp(rng.uniform(-8, 8, 2000))
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(2000)
    x = x.astype(dtype)
    out, vjp_fn = unigrad.vjp(lambda x: x ** 2, x)
    np.testing.assert_array_equal(out, x ** 2)
    assert out.dtype == x.dtype
    ct = np.ones_like(out)
    np.testing.assert_array_equal(vjp_fn(ct)[0], ct * (x + x))
    np.testing.assert_array_equal(traced(lambda x: x ** 2, x), x ** 2)
