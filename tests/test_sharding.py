"""A batch sharded over a mesh of 4 host devices through the compiled transforms (backend="jax").

XLA reads ``--xla_force_host_platform_device_count`` when JAX starts, so the cases run in one
subprocess with the flag set (this process's JAX, if any, keeps its single CPU device). Each case
compares the sharded call with the same call on unsharded arrays (float64, under JAX's scoped x64
context) and reads the output's sharding: per-example results stay sharded along the batch axis,
gradients of replicated parameters stay replicated.

Every transform keeps a batch sharded along the batch axis and parameters replicated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import skip_module_unless

skip_module_unless("jax")

_SCRIPT = r'''
import json, os, traceback
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import unigrad

assert len(jax.devices()) == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("batch",))
rng = np.random.default_rng(0)
x_np, w_np = rng.normal(size=(8, 3)), rng.normal(size=(3, 2))
with jax.enable_x64(True):  # scoped: float64 arrays without the global flag
    x_sharded = jax.device_put(x_np, NamedSharding(mesh, P("batch")))
    w_replicated = jax.device_put(w_np, NamedSharding(mesh, P()))
    x_plain, w_plain = jnp.asarray(x_np), jnp.asarray(w_np)
assert x_sharded.dtype == jnp.float64 and x_sharded.sharding.spec == P("batch")


def model(x, w):  # a batch (B, 3) -> (B, 2)
    return jnp.tanh(x @ w)


def loss(w, x):  # a scalar over the whole batch
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def example_loss(w, x):  # one example's loss
    return jnp.sum(jnp.tanh(x @ w) ** 2)


cases = {
    "batched_jacobian": lambda x, w: unigrad.batched_jacobian(model, backend="jax", compile=True)(x, w),
    "vmap": lambda x, w: unigrad.vmap(model, in_axes=(0, None), backend="jax")(x, w),
    "per_example_grad": lambda x, w: unigrad.vmap(unigrad.grad(example_loss, backend="jax", compile=True),
                                                   in_axes=(None, 0), backend="jax")(w, x),
    "grad_params": lambda x, w: unigrad.grad(loss, backend="jax", compile=True)(w, x),
    "grad_batch": lambda x, w: unigrad.grad(loss, argnums=1, backend="jax", compile=True)(w, x),
    "value_and_grad": lambda x, w: unigrad.value_and_grad(loss, backend="jax", compile=True)(w, x),
    "jacobian": lambda x, w: unigrad.jacobian(model, backend="jax", compile=True)(x, w),
    # a NumPy cotangent for sharded primals (converted to the primal's placement)
    "vjp_numpy_cotangent": lambda x, w: unigrad.vjp(model, x, w)[1](np.linspace(-1.0, 1.0, 16).reshape(8, 2)),
}

def spec_of(a):
    """The partition spec, one entry per axis (None: not split), or why there is none."""
    if not isinstance(a.sharding, NamedSharding):
        return "not a NamedSharding: " + repr(a.sharding)
    spec = tuple(a.sharding.spec) + (None,) * (a.ndim - len(a.sharding.spec))
    return [None if s is None else str(s) for s in spec]


report = {}
for name, run in cases.items():
    try:
        expected = [np.asarray(v) for v in jax.tree_util.tree_leaves(run(x_plain, w_plain))]
        for _ in range(2):  # the second call takes the compiled fast path
            got = jax.tree_util.tree_leaves(run(x_sharded, w_replicated))
        report[name] = {
            "error": None,
            "max_error": max(float(np.max(np.abs(np.asarray(g) - e), initial=0.0)) for g, e in zip(got, expected)),
            "dtypes": [str(g.dtype) for g in got],
            "shapes": [list(g.shape) for g in got],
            "specs": [spec_of(g) for g in got],
            "devices": [len(g.devices()) for g in got],
        }
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        report[name] = {"error": f"{type(e).__name__}: {e}",
                        "where": f"{os.path.basename(os.path.dirname(frame.filename))}/"
                                 f"{os.path.basename(frame.filename)}:{frame.lineno}"}
print("REPORT" + json.dumps(report))
'''


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[0][len("REPORT"):])


def _check(case, batch_axes, replicated=False, per_leaf=None):
    """The case ran, equals the unsharded result, and each output leaf is sharded along one of
    ``batch_axes`` (or replicated); ``per_leaf``: one (batch_axes, replicated) per output leaf."""
    assert case["error"] is None, f"{case['error']} (at {case.get('where')})"
    assert case["max_error"] <= 1e-12, case["max_error"]  # the unsharded result, to float64 rounding
    assert all(d == "float64" for d in case["dtypes"]), case["dtypes"]
    per_leaf = per_leaf or [(batch_axes, replicated)] * len(case["specs"])
    assert len(per_leaf) == len(case["specs"])
    for spec, devices, (axes, whole) in zip(case["specs"], case["devices"], per_leaf):
        assert isinstance(spec, list), spec
        assert devices == 4, "the result is not on the mesh"
        if whole:
            assert all(s is None for s in spec), f"expected replicated, got {spec}"
        else:
            assert any(spec[a] == "batch" for a in axes), f"expected sharded along a batch axis, got {spec}"




def test_batched_jacobian(report):
    _check(report["batched_jacobian"], batch_axes=[0])


def test_vmap(report):
    _check(report["vmap"], batch_axes=[0])


def test_per_example_grad(report):
    _check(report["per_example_grad"], batch_axes=[0])


def test_grad_of_replicated_parameters_is_replicated(report):
    _check(report["grad_params"], batch_axes=[], replicated=True)


def test_grad_of_the_batch_stays_sharded(report):
    _check(report["grad_batch"], batch_axes=[0])


def test_value_and_grad(report):
    _check(report["value_and_grad"], batch_axes=[], replicated=True)


def test_jacobian(report):
    # (B, 2) wrt (B, 3): shape (B, 2, B, 3); either batch axis may carry the sharding
    _check(report["jacobian"], batch_axes=[0, 2])


def test_vjp_with_a_numpy_cotangent(report):
    # the cotangent pulled back to x (sharded along the batch) and to w (replicated)
    _check(report["vjp_numpy_cotangent"], None, per_leaf=[([0], False), ([], True)])
