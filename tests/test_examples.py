"""Every script in examples/ runs and asserts its own result (each script's main checks what it shows)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from conftest import skip_unless

import unigrad

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Scripts whose main(backend) runs on one backend: run on each selected backend.
PER_BACKEND = ["linear_regression.py", "scipy_minimize.py", "newton_cg_hvp.py", "custom_derivatives.py",
               "brusselator_newton.py"]
# Scripts whose main() runs every installed backend itself.
ALL_BACKENDS = ["mlp_loss.py", "per_example_jacobian.py"]


def test_every_example_is_run_here():
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == set(PER_BACKEND + ALL_BACKENDS + ["native_torch_and_tensorflow.py", "torch_model_in_jax_loss.py",
                                                        "using_models.py"] + IMPLICIT)


# Derivatives of solutions (issue 39): run one backend per case by tests/test_implicit_examples.py.
IMPLICIT = ["deep_equilibrium.py", "bilevel_logistic.py", "batched_roots.py"]


def _main(script):
    return runpy.run_path(str(EXAMPLES / script), run_name="example")["main"]


# Every script runs on every backend in the thorough job; the default run leaves out these pairs (tens of seconds
# each of eager compiles), keeping every script on the tape, torch and autograd, and JAX and TensorFlow with
# the scripts not listed (JAX: linear_regression, scipy_minimize; TensorFlow: all but brusselator_newton).
SLOW_CASES = {"test_example_on_each_backend[jax-brusselator_newton.py]",
              "test_example_on_each_backend[jax-custom_derivatives.py]",
              "test_example_on_each_backend[jax-newton_cg_hvp.py]",
              "test_example_on_each_backend[tensorflow-brusselator_newton.py]"}


# the examples check their float64 answers to float64's accuracy: skipped on a backend that computes no float64
FLOAT64_TESTS = ("test_example_on_each_backend",)


@pytest.mark.parametrize("script", PER_BACKEND)
def test_example_on_each_backend(script, backend, capsys):
    _main(script)(backend)
    assert capsys.readouterr().out.startswith(f"{backend}: ")


@pytest.mark.parametrize("script", ALL_BACKENDS)
def test_example_on_every_installed_backend(script, capsys):
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    installed = [name for name, info in unigrad.backends().items() if info["available"]]
    assert [line.split(":")[0].strip() for line in lines] == sorted(installed, key=lambda n: n != "numpy")
    single = {n for n in installed if not unigrad.get_backend(n).capabilities.float64}  # float32's accuracy
    for line in lines:
        name = line.split(":")[0].strip()
        if script == "per_example_jacobian.py":
            assert "(6, 3, 4)" in line and float(line.rsplit(":", 1)[1]) < (1e-5 if name in single else 1e-12)
        elif name in single:
            assert abs(float(line.split("loss = ")[1].split()[0]) - 0.6134800918) < 1e-5, line
        else:
            assert "loss = 0.6134800918" in line


def test_torch_model_in_a_jax_loss_trains_and_checks(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    first, last = _main("torch_model_in_jax_loss.py")(steps=10)
    assert last < 0.7 * first  # the JAX loop optimised the torch model's parameters
    assert "finite differences and numpy, jax, torch" in capsys.readouterr().out


def test_native_torch_and_tensorflow_models_agree():
    skip_unless("torch")
    skip_unless("tensorflow")
    report = _main("native_torch_and_tensorflow.py")()
    assert report.ok and [r.backend for r in report.results] == ["torch", "tensorflow"]


def test_the_comparison_would_catch_a_mis_ported_model(monkeypatch):
    # The example's check is only worth something if it can fail: port the layer norm's epsilon wrongly.
    skip_unless("torch")
    skip_unless("tensorflow")
    namespace = runpy.run_path(str(EXAMPLES / "native_torch_and_tensorflow.py"), run_name="example")
    import tensorflow as tf

    def mis_ported(w1, b1, w2, x):
        h = tf.nn.softplus(tf.matmul(x, w1) + b1)
        mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
        h = (h - mean) / tf.sqrt(variance + 1e-3)  # 1e-3 where torch uses 1e-5
        return tf.reduce_sum(tf.tanh(tf.matmul(h, w2)), axis=-1)

    namespace["main"].__globals__["tensorflow_model"] = mis_ported
    with pytest.raises(AssertionError, match="differ"):
        namespace["main"]()


def test_models_of_each_framework_agree_with_the_framework(capsys):
    # using_models.py's main asserts grad, jacobian, hvp and per_example_grad against each framework's own
    results = _main("using_models.py")()
    installed = {name for name, info in unigrad.backends().items() if info["available"]}
    assert set(results) == {"torch", "jax", "tensorflow"} & installed
    assert len(capsys.readouterr().out.splitlines()) == len(results)
