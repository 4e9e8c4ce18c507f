"""Models, not only functions: a PyTorch nn.Module, a JAX model as a pytree, a Keras 3 model.

Each framework's usual model object holds its parameters; unigrad's transforms differentiate
arguments. So each model is called as a function of its parameters, passed as a pytree:

* PyTorch: ``torch.func.functional_call(module, params, (x,))`` with ``params`` a dict of tensors
  (``dict(module.named_parameters())``, detached);
* JAX: the Flax / Equinox convention, a pytree of arrays and a pure ``apply(params, x)``;
* Keras 3: ``model.stateless_call(trainable, non_trainable, x)`` with the weights as lists.

Each model then goes through ``grad``, ``jacobian``, ``hvp`` and ``per_example_grad``, and every
result is checked against the framework's own way of computing it.

Run it:    python examples/using_models.py
"""

import numpy as np

import unigrad


def data(seed=0, batch=6, n_in=4, n_classes=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, n_in)).astype(np.float32), rng.integers(n_classes, size=batch)


def close(a, b, tol=1e-4):
    a, b = unigrad.to_numpy(a), unigrad.to_numpy(b)
    return np.allclose(a, b, rtol=tol, atol=tol * 1e-2)


# ------------------------------------------------------------------ PyTorch nn.Module

def torch_model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    params = {name: p.detach().clone() for name, p in model.named_parameters()}  # a pytree: a dict of tensors
    x, y = data()
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    def losses(params, x, y):
        """One cross-entropy per example: the module called with the parameters it is given."""
        logits = torch.func.functional_call(model, params, (x,))
        return torch.nn.functional.cross_entropy(logits, y, reduction="none")

    def loss(params, x, y):
        return losses(params, x, y).mean()

    g = unigrad.grad(loss)(params, x, y)                       # a dict like params
    model.zero_grad()
    loss(dict(model.named_parameters()), x, y).backward()     # torch's own gradient
    assert all(close(g[k], p.grad) for k, p in model.named_parameters())

    logits_of = lambda params: torch.func.functional_call(model, params, (x[:2],))  # noqa: E731
    J = unigrad.jacobian(logits_of)(params)                    # J[name]: (2, 3, *param.shape)
    J_torch = torch.func.jacrev(logits_of)(params)
    assert all(close(J[k], J_torch[k]) for k in params)

    v = {k: torch.ones_like(p) for k, p in params.items()}
    (hv,) = unigrad.hvp(lambda p: loss(p, x, y), (params,), (v,))
    _, hv_torch = torch.func.jvp(torch.func.grad(lambda p: loss(p, x, y)), (params,), (v,))
    assert all(close(hv[k], hv_torch[k]) for k in params)

    per_example = unigrad.per_example_grad(losses, batch_argnum=(1, 2))(params, x, y)  # each (B, *shape)

    def loss_of_one(params, xi, yi):
        return losses(params, xi[None], yi[None])[0]

    reference = torch.func.vmap(torch.func.grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)
    assert all(close(per_example[k], reference[k]) for k in params)
    return float(loss(params, x, y))


# ------------------------------------------------------------------ JAX: a pytree of parameters

def jax_model():
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = {"layers": [{"w": 0.5 * jax.random.normal(k1, (4, 8)), "b": jnp.zeros(8)},
                         {"w": 0.5 * jax.random.normal(k2, (8, 3)), "b": jnp.zeros(3)}]}
    x, y = data()
    x, y = jnp.asarray(x), jnp.asarray(y)

    def apply(params, x):
        """A pure function of the parameters, as Flax's ``Module.apply`` and Equinox's modules are."""
        *hidden, last = params["layers"]
        for layer in hidden:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x @ last["w"] + last["b"]

    def losses(params, x, y):
        logp = jax.nn.log_softmax(apply(params, x))
        return -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]

    def loss(params, x, y):
        return losses(params, x, y).mean()

    def same_tree(a, b):
        return all(close(p, q) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    assert same_tree(unigrad.grad(loss)(params, x, y), jax.grad(loss)(params, x, y))
    assert same_tree(unigrad.jacobian(apply)(params, x[:2]), jax.jacrev(apply)(params, x[:2]))
    v = jax.tree.map(jnp.ones_like, params)
    (hv,) = unigrad.hvp(lambda p: loss(p, x, y), (params,), (v,))
    assert same_tree(hv, jax.jvp(jax.grad(lambda p: loss(p, x, y)), (params,), (v,))[1])
    per_example = unigrad.per_example_grad(losses, batch_argnum=(1, 2), compile=True)(params, x, y)

    def loss_of_one(params, xi, yi):
        return losses(params, xi[None], yi[None])[0]

    assert same_tree(per_example, jax.vmap(jax.grad(loss_of_one), in_axes=(None, 0, 0))(params, x, y))
    return float(loss(params, x, y))


# ------------------------------------------------------------------ Keras 3: stateless_call

def keras_model():
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    trainable = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]  # a list: a pytree
    non_trainable = [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables]
    x, y = data()
    x, y = tf.constant(x), tf.constant(y)

    def losses(trainable, x, y):
        logits, _ = model.stateless_call(trainable, non_trainable, x)  # (outputs, new non-trainable state)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)

    def loss(trainable, x, y):
        return tf.reduce_mean(losses(trainable, x, y))

    g = unigrad.grad(loss)(trainable, x, y)
    with tf.GradientTape() as tape:
        value = loss(model.trainable_variables, x, y)
    assert all(close(a, b) for a, b in zip(g, tape.gradient(value, model.trainable_variables)))

    def logits_of(trainable):
        return model.stateless_call(trainable, non_trainable, x[:2])[0]

    J = unigrad.jacobian(logits_of)(trainable)                  # one block per weight: (2, 3, *weight.shape)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(trainable)
        out = logits_of(trainable)
    assert all(close(a, b) for a, b in zip(J, tape.jacobian(out, trainable)))

    v = [tf.ones_like(w) for w in trainable]
    (hv,) = unigrad.hvp(lambda t: loss(t, x, y), (trainable,), (v,))
    with tf.autodiff.ForwardAccumulator(trainable, v) as accumulator:
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            value = loss(trainable, x, y)
        grads = tape.gradient(value, trainable)
    assert all(close(a, accumulator.jvp(b)) for a, b in zip(hv, grads))

    per_example = unigrad.per_example_grad(losses, batch_argnum=(1, 2))(trainable, x, y)
    for i in range(2):  # two examples, each against an ordinary gradient of its own loss
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            one = losses(trainable, x[i:i + 1], y[i:i + 1])[0]
        assert all(close(a[i], b) for a, b in zip(per_example, tape.gradient(one, trainable)))
    return float(loss(trainable, x, y))


def main():
    installed = {name for name, info in unigrad.backends().items() if info["available"]}
    results = {}
    for name, run in (("torch", torch_model), ("jax", jax_model), ("tensorflow", keras_model)):
        if name in installed:
            results[name] = run()
            print(f"{name}: grad, jacobian, hvp and per_example_grad agree with {name}'s own; "
                  f"loss = {results[name]:.6f}")
    return results


if __name__ == "__main__":
    main()
