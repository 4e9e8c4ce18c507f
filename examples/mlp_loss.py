"""The gradient of an MLP loss with respect to its inputs and its parameters -- without Jacobians.

A scalar loss of a two-layer network. ``unigrad.value_and_grad`` returns the loss and its gradient
with respect to the parameters (a dict) and the inputs in ONE reverse sweep: the cost is a small
multiple of the forward pass, and no Jacobian (outputs x parameters) is ever built.

Run it:    python examples/mlp_loss.py
Check it:  unigrad check examples/mlp_loss.py:loss
           (inputs come from ``loss_inputs`` below; every installed backend is compared with the
           others and with finite differences)
"""

import numpy as np

import unigrad


def loss(params, x, y):
    """Mean squared error of a tanh MLP: params = {"w1", "b1", "w2", "b2"}, x (batch, features), y (batch, 1)."""
    xp = unigrad.namespace(x)
    hidden = xp.tanh(xp.matmul(x, params["w1"]) + params["b1"])
    prediction = xp.matmul(hidden, params["w2"]) + params["b2"]
    return xp.mean((prediction - y) ** 2)


def loss_inputs(seed=0, batch=8, features=5, width=16):
    """The arguments of ``loss``: parameters, inputs and targets (NumPy, float64)."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.standard_normal((features, width)) / np.sqrt(features),
        "b1": np.zeros(width),
        "w2": rng.standard_normal((width, 1)) / np.sqrt(width),
        "b2": np.zeros(1),
    }
    x = rng.standard_normal((batch, features))
    y = np.sin(x.sum(axis=1, keepdims=True))
    return params, x, y


def main():
    params, x, y = loss_inputs()
    reference = None
    installed = [name for name, info in unigrad.backends().items() if info["available"]]
    for name in sorted(installed, key=lambda n: n != "numpy"):  # the NumPy tape first
        # argnums=(0, 1): the gradient with respect to the parameters and to the inputs, one backward pass
        value, (grad_params, grad_x) = unigrad.value_and_grad(loss, argnums=(0, 1), backend=name)(params, x, y)
        grads = {k: unigrad.to_numpy(v) for k, v in grad_params.items()}
        grads["x"] = unigrad.to_numpy(grad_x)
        norms = ", ".join(f"|d/d{k}| = {np.linalg.norm(v):.6f}" for k, v in grads.items())
        line = f"{name:>10}: loss = {float(unigrad.to_numpy(value)):.10f}  {norms}"
        if reference is None:
            reference = grads
        else:
            diff = max(float(np.max(np.abs(grads[k] - reference[k]))) for k in grads)
            line += f"  (max |difference| from the first backend: {diff:.1e})"
            # float64 agrees to rounding; a backend that computes no float64 (MLX) gets float32's accuracy
            assert diff < (1e-12 if unigrad.get_backend(name).capabilities.float64 else 1e-5), (name, diff)
        print(line)


if __name__ == "__main__":
    main()
