"""One model written twice -- natively in PyTorch and in TensorFlow -- proved to have the same derivatives.

Porting a model between frameworks, the question is not only "same outputs?" but "same
gradients?". Here a two-layer network with a softplus and a layer norm is written with each
framework's own functions (``torch.nn.functional``, ``tf.nn``), both load the same weights, and
``unigrad.testing.compare`` runs value, VJP, JVP and Jacobian of each through unigrad, against
each other and against finite differences.

Run it:    python examples/native_torch_and_tensorflow.py
"""

import numpy as np

import unigrad
import unigrad.testing


def torch_model(w1, b1, w2, x):
    import torch
    import torch.nn.functional as F

    h = F.softplus(x @ w1 + b1)
    h = F.layer_norm(h, h.shape[-1:], eps=1e-5)
    return torch.tanh(h @ w2).sum(dim=-1)


def tensorflow_model(w1, b1, w2, x):
    import tensorflow as tf

    h = tf.nn.softplus(tf.matmul(x, w1) + b1)
    mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
    h = (h - mean) / tf.sqrt(variance + 1e-5)
    return tf.reduce_sum(tf.tanh(tf.matmul(h, w2)), axis=-1)


def model(w1, b1, w2, x):
    """The model as unigrad sees it: each backend runs its own framework's version."""
    framework = type(x).__module__.split(".")[0]
    if framework == "torch":
        return torch_model(w1, b1, w2, x)
    if framework in ("tensorflow", "unigrad_tensorflow"):  # inside a transform, TensorFlow's values are
        return tensorflow_model(w1, b1, w2, x)               # unigrad's Array API arrays (tf.* takes them)
    raise TypeError(f"model is written for torch and tensorflow arrays, got {type(x).__name__}")


def weights(seed=0, batch=4, n_in=3, n_hidden=5, n_out=2):
    """Shared weights (and inputs), float64: each framework gets the same values."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n_in, n_hidden)), 0.1 * rng.standard_normal(n_hidden),
            rng.standard_normal((n_hidden, n_out)), rng.standard_normal((batch, n_in)))


def main():
    installed = {name for name, info in unigrad.backends().items() if info["available"]}
    if not {"torch", "tensorflow"} <= installed:
        print("needs both torch and tensorflow: pip install 'unigrad[torch,tensorflow]'")
        return None
    # every argument is differentiated: the weights and the inputs
    report = unigrad.testing.compare(model, weights(), backends=["torch", "tensorflow"], argnums=(0, 1, 2, 3),
                                     reference="torch")
    print(report)
    assert report.ok, "the two models' derivatives differ"
    return report


if __name__ == "__main__":
    main()
