"""A PyTorch model inside a JAX loss: ``unigrad.bridge`` makes the module one differentiable operation.

The model is an ordinary ``torch.nn.Module``; ``torch.func.functional_call`` runs it with parameters
passed in as tensors, so its parameters can live in JAX and be optimised by a JAX loop. Inside
``unigrad.value_and_grad(..., backend="jax")`` the bridge hands JAX's arrays to torch by DLPack, runs
the module, and hands the result back; JAX's reverse mode calls torch's VJP for the module's part.
With ``compile=True`` the call becomes a ``jax.pure_callback`` (a host round trip) with the same rule.

The gradient is validated two ways: ``unigrad.testing.check_grads`` against finite differences, and
``unigrad.testing.compare`` of the bridged loss on JAX with the same loss evaluated by every backend
that can run it.

Run it:    python examples/torch_model_in_jax_loss.py
"""

import numpy as np
import torch

import unigrad
from unigrad.testing import check_grads, compare

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
NAMES = [name for name, _ in MODEL.named_parameters()]


def model(params, x):
    """The module as a function of its parameters (torch tensors) and inputs: torch code only."""
    return torch.func.functional_call(MODEL, dict(zip(NAMES, params)), (x,))


torch_model = unigrad.bridge(model, backend="torch")


def loss(params, x, y):
    """Mean squared error; the model runs on torch, the rest on whichever backend calls it."""
    prediction = torch_model(params, x)  # the calling backend's array
    xp = unigrad.namespace(prediction)
    return xp.mean((prediction - y) ** 2)


def data(seed=0, n=64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def main(steps=30, learning_rate=0.1):
    import jax

    x, y = data()
    # the parameters live in JAX (float64 kept: unigrad.asarray, JAX's global x64 flag untouched)
    params = [unigrad.asarray(p.detach().numpy(), backend="jax") for p in MODEL.parameters()]
    step = unigrad.value_and_grad(loss, backend="jax", compile=True)
    first, _ = step(params, x, y)
    for _ in range(steps):
        value, grads = step(params, x, y)
        with jax.enable_x64(True):  # JAX's scoped 64-bit mode: the update stays float64
            params = [p - learning_rate * g for p, g in zip(params, grads)]  # plain gradient descent in JAX
    last, grads = step(params, x, y)
    print(f"jax loss with a torch model: {float(first):.4f} -> {float(last):.4f} after {steps} steps")

    # The bridged gradient against finite differences (JAX calling torch), then against every backend
    # that evaluates the same loss (each one calling the torch model through the bridge).
    small = [np.asarray(p) for p in params]
    check_grads(lambda *p: loss(list(p), x[:8], y[:8]), tuple(small), order=1, backend="jax")
    report = compare(loss, (small, x[:8], y[:8]), backends=["jax", "numpy", "torch"], argnums=0,
                     jacobian=False, repeats=0)
    assert report.ok, report
    print("gradient checked: finite differences and", ", ".join(r.backend for r in report.results))
    return float(first), float(last)


if __name__ == "__main__":
    main()
