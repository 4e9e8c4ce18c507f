"""torch per_example_grad / per_example_grad_norms on the layers beyond dense ones: convolutions,
embeddings, LayerNorm/GroupNorm scales and shifts, weights used twice, biases through views,
``F.linear(x, w.T)``. Each is checked against torch.func's ``vmap(grad)`` of one example's loss, with
``.paths`` showing the one-backward-pass way taken; models that mix rows stay right (materialised)."""

from __future__ import annotations

import pytest

from unigrad.per_example import layers as pe

torch = pytest.importorskip("torch")
F = torch.nn.functional

import unigrad  # noqa: E402

B = 4
DT = torch.float64


def reference(losses, params, batch):
    """(rows, norms) from torch.func: vmap over the examples of grad of one example's loss."""
    def one(p, *b):
        return losses(p, *[t[None] for t in b])[0]

    rows = torch.func.vmap(torch.func.grad(one), in_dims=(None,) + (0,) * len(batch))(params, *batch)
    return rows, torch.sqrt(sum((g.reshape(B, -1) ** 2).sum(1) for g in rows.values()))


def check(losses, params, *batch, rtol=1e-10):
    """Rows and norms equal torch.func's; returns the paths of (per_example_grad, per_example_grad_norms)."""
    want_rows, want_norms = reference(losses, params, batch)
    argnums = tuple(range(1, 1 + len(batch)))
    rows_f = unigrad.per_example_grad(losses, batch_argnum=argnums)
    norms_f = unigrad.per_example_grad_norms(losses, batch_argnum=argnums)
    rows = rows_f(params, *batch)
    for k in params:
        torch.testing.assert_close(rows[k], want_rows[k], rtol=rtol, atol=1e-12, msg=k)
    torch.testing.assert_close(norms_f(params, *batch), want_norms, rtol=rtol, atol=0)
    return ({k.split("'")[1]: v for k, v in rows_f.paths.items()},
            {k.split("'")[1]: v for k, v in norms_f.paths.items()})


def test_cnn_module():
    """conv2d (stride 2, padding 1, bias) - relu - conv2d (groups 2, dilation 2, no bias) - linear, per-example
    cross-entropy: every parameter from one backward pass."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 6, 2, groups=2, dilation=2, bias=False), torch.nn.Flatten(),
                                torch.nn.Linear(6 * 2 * 2, 3)).to(DT)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(B, 2, 7, 7, dtype=DT), torch.randint(3, (B,))

    def losses(p, x, y):
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y, reduction="none")

    rows, norms = check(losses, params, x, y)
    assert rows == {"0.weight": pe.CONV, "0.bias": pe.BIAS, "2.weight": pe.CONV, "4.weight": pe.DENSE,
                    "4.bias": pe.BIAS}
    # 16 positions, 4x18 weight: G^T U; 4 positions, 6x(2*2*2)/group-of-3: ghost (U U^T) * (G G^T)
    assert norms["0.weight"] == pe.CONV and norms["2.weight"] == pe.CONV_GHOST


@pytest.mark.parametrize("stride, padding, dilation, groups, bias", [(2, 1, 2, 2, True), (1, 0, 1, 1, False)])
def test_conv1d(stride, padding, dilation, groups, bias):
    torch.manual_seed(1)
    params = {"w": torch.randn(6, 4 // groups, 3, dtype=DT)}
    if bias:
        params["b"] = torch.randn(6, dtype=DT)
    x = torch.randn(B, 4, 11, dtype=DT)

    def losses(p, x):
        h = F.conv1d(x, p["w"], p.get("b"), stride=stride, padding=padding, dilation=dilation, groups=groups)
        if bias:  # (a per-example padding after the layer: rows still apart)
            h = F.interpolate(F.pad(h, (2, 2), mode="reflect"), scale_factor=2)
        return (torch.tanh(h) ** 2).sum((1, 2))

    rows, norms = check(losses, params, x)
    assert rows["w"] == pe.CONV and rows.get("b", pe.BIAS) == pe.BIAS


def test_einsum_and_products_reshaped_back():
    """einsum (a batched product with a leading axis of one, the weight through unsqueeze/permute/view) and
    a product of flattened rows reshaped back to (B, positions, k): dense, with the batch in blocks."""
    torch.manual_seed(11)
    params = {"W": torch.randn(5, 3, dtype=DT), "V": torch.randn(3, 2, dtype=DT)}
    x = torch.randn(B, 6, 5, dtype=DT)

    def losses(p, x):
        h = torch.tanh(torch.einsum("btd,dk->btk", x, p["W"]))  # (B, 6, 3)
        z = (h.transpose(1, 2).reshape(-1, 3) @ p["V"]).reshape(x.shape[0], 3, 2, 2)  # 6 rows per example
        return (torch.tanh(z) ** 2).sum((1, 2, 3))

    rows, norms = check(losses, params, x)
    assert rows == norms == {"W": pe.DENSE, "V": pe.DENSE}  # (6 positions, 36 > 5 * 3: X^T G)


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention(batch_first):
    """nn.TransformerEncoderLayer (batch first) and nn.MultiheadAttention (sequence first) with a key padding
    mask: the projections see (positions, B, features), attention runs on (B, heads, positions, d) and the
    output projection reads rows with the batch as the inner factor; every parameter from one backward pass."""
    torch.manual_seed(12)
    if batch_first:
        model = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).to(DT)
        x = torch.randn(B, 5, 8, dtype=DT)
    else:
        model = torch.nn.MultiheadAttention(8, 2).to(DT)
        x = torch.randn(B, 5, 8, dtype=DT)  # examples first here; f moves them to axis 1
    params = {k: v.detach() for k, v in model.named_parameters()}
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True], [False] * 5])

    def losses(p, x, m):
        if batch_first:
            h = torch.func.functional_call(model, p, (x,))
        else:
            s = x.transpose(0, 1)
            h = torch.func.functional_call(model, p, (s, s, s), {"key_padding_mask": m, "need_weights": False})[0]
            h = h.transpose(0, 1)
        return (torch.tanh(h) ** 2).sum((1, 2))

    rows, norms = check(losses, params, x, mask)
    assert all(v in (pe.DENSE, pe.BIAS, pe.NORM) for v in rows.values()), rows
    assert norms["self_attn.in_proj_weight" if batch_first else "in_proj_weight"] == pe.DENSE_GHOST
    if not batch_first:  # the examples given as the sequence axis: attention mixes them (the projection into
        # it materialised; the one out of it reads mixed inputs, but rows stay apart after it: one pass)
        def mixed(p, x):
            return (torch.func.functional_call(model, p, (x, x, x), {"need_weights": False})[0] ** 2).sum((1, 2))

        pe_f = unigrad.per_example_grad(mixed)
        got, want = pe_f(params, x), torch.func.jacrev(mixed)(params, x)
        for k in params:
            torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
        assert pe_f.paths == {"argument 0['in_proj_weight']": pe.MATERIALISED,
                              "argument 0['in_proj_bias']": pe.MATERIALISED,
                              "argument 0['out_proj.weight']": pe.DENSE, "argument 0['out_proj.bias']": pe.BIAS}


def test_conv3d_and_a_convolution_used_twice():
    """conv3d (no patches: the rows by torch's own weight gradient, the examples as groups), and one
    kernel applied twice (both uses' patches stacked: the norm of the sum)."""
    torch.manual_seed(10)
    params = {"w3": torch.randn(3, 2, 2, 2, 2, dtype=DT), "b3": torch.randn(3, dtype=DT),
              "k": torch.randn(2, 2, 3, dtype=DT)}
    x3, x1 = torch.randn(B, 2, 4, 4, 4, dtype=DT), torch.randn(B, 2, 7, dtype=DT)

    def losses(p, x3, x1):
        h = torch.tanh(F.conv3d(x3, p["w3"], p["b3"], stride=2, padding=1)).sum((1, 2, 3, 4))
        g = torch.tanh(F.conv1d(torch.tanh(F.conv1d(x1, p["k"], padding=1)), p["k"], padding=1))
        return h + (g ** 2).sum((1, 2))

    rows, norms = check(losses, params, x3, x1)
    assert rows == {"w3": pe.CONV, "b3": pe.BIAS, "k": pe.SHARED}


@pytest.mark.parametrize("vocabulary, ghost", [(10, False), (60, True)])
def test_embedding_with_padding_and_repeated_indices(vocabulary, ghost):
    """Repeated indices within an example add up; the padding row gets nothing. Norms by the index
    comparison (P^2 <= vocabulary) or from the scattered rows."""
    torch.manual_seed(2)
    params = {"E": torch.randn(vocabulary, 5, dtype=DT), "W": torch.randn(5, 3, dtype=DT)}
    idx = torch.tensor([[1, 2, 1, 0, 3], [0, 0, 0, 4, 5], [9, 9, 2, 2, 1], [3, 3, 3, 3, 3]], dtype=torch.int32)

    def losses(p, i):
        return (torch.tanh(F.embedding(i, p["E"], padding_idx=0) @ p["W"]) ** 2).sum((1, 2))

    rows, norms = check(losses, params, idx)
    assert rows == {"E": pe.EMBEDDING, "W": pe.DENSE}
    assert norms["E"] == (pe.EMBEDDING_GHOST if ghost else pe.EMBEDDING)


def test_embedding_layer_norm_sequence_model():
    """nn.Embedding - LayerNorm - Linear, per-token cross-entropy summed over each sequence."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Embedding(12, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 12)).to(DT)
    params = {k: v.detach() for k, v in model.named_parameters()}
    tokens, targets = torch.randint(12, (B, 5)), torch.randint(12, (B, 5))

    def losses(p, t, y):
        z = torch.func.functional_call(model, p, (t,))
        return F.cross_entropy(z.reshape(-1, 12), y.reshape(-1), reduction="none").reshape(t.shape[0], -1).sum(1)

    rows, norms = check(losses, params, tokens, targets)
    assert rows == {"0.weight": pe.EMBEDDING, "1.weight": pe.NORM, "1.bias": pe.BIAS, "2.weight": pe.DENSE,
                    "2.bias": pe.BIAS}
    assert norms["2.weight"] == pe.DENSE_GHOST


def test_group_norm_and_batch_norm_in_eval_mode():
    torch.manual_seed(4)
    params = {"g": torch.randn(4, dtype=DT), "b": torch.randn(4, dtype=DT), "w": torch.randn(4, 4, 1, 1, dtype=DT),
              "bn.g": torch.randn(4, dtype=DT), "bn.b": torch.randn(4, dtype=DT)}
    mean, var = torch.randn(4, dtype=DT), torch.rand(4, dtype=DT) + 0.5
    x = torch.randn(B, 4, 3, 3, dtype=DT)

    def losses(p, x):
        h = F.batch_norm(F.conv2d(x, p["w"]), mean, var, p["bn.g"], p["bn.b"], training=False)
        return (torch.tanh(F.group_norm(h, 2, p["g"], p["b"])) ** 2).sum((1, 2, 3))

    rows, _ = check(losses, params, x)
    assert rows == {"g": pe.NORM, "b": pe.BIAS, "w": pe.CONV, "bn.g": pe.NORM, "bn.b": pe.BIAS}


def test_weight_used_twice_views_and_transposes():
    """A weight used by two dense layers (as W and as W^T through einsum: the norm of the sum, stacked),
    a tied embedding and output projection (rows: each use's summed; norms: stacked, one-hot rows for the
    lookups), F.linear(x, w.T), and a bias and a scale reached through views."""
    torch.manual_seed(5)
    params = {"W": torch.randn(4, 4, dtype=DT), "V": torch.randn(4, 3, dtype=DT), "E": torch.randn(12, 4, dtype=DT),
              "b": torch.randn(4, dtype=DT), "s": torch.randn(4, dtype=DT)}
    x, idx = torch.randn(B, 4, dtype=DT), torch.tensor([[1, 1, 0], [5, 2, 5], [0, 3, 11], [7, 7, 7]])

    def losses(p, x, i):
        h = torch.tanh(torch.einsum("bd,dk->bk", torch.tanh(x @ p["W"]), p["W"].T))
        h = torch.tanh(F.linear(h, p["V"].T))  # (B, 3): V used as (V^T)^T
        h = h[:, None, :, None] * p["s"].view(1, -1, 1, 1) + p["b"][None, :, None, None]  # (B, 4, 3, 1)
        e = F.embedding(i, p["E"])  # (B, 3, 4)
        z = (e + h[..., 0].transpose(1, 2)) @ p["E"].T  # tied output projection
        return torch.log_softmax(z, -1)[..., 0].sum(1)

    rows, norms = check(losses, params, x, idx)
    assert rows == {"W": pe.SHARED, "V": pe.DENSE, "E": pe.SHARED_SUMMED, "b": pe.BIAS, "s": pe.SCALE}
    assert norms["V"] == pe.DENSE_OUTER
    assert norms["E"] == pe.SHARED  # lookups' one-hot rows stacked with the projection's: ghost clipped


def _lookup_model(tied):
    """Norms by the lookups' index comparison: a table used by lookups alone (ghost), or tied to an output
    projection too (stacked with its dense factors)."""
    torch.manual_seed(9)
    params = {"E": torch.randn(40, 4, dtype=DT), "W": torch.randn(4, 4, dtype=DT)}
    idx = torch.tensor([[1, 1, 0], [5, 2, 5], [0, 3, 11], [7, 7, 7]])

    def losses(p, i):
        h = torch.tanh(F.embedding(i, p["E"], padding_idx=0) @ p["W"])
        if tied:
            return torch.log_softmax(h @ p["E"].T, -1)[..., 1].sum(1)
        return (h ** 2).sum((1, 2))
    return losses, params, idx


@pytest.mark.parametrize("directions", [True, False])
@pytest.mark.parametrize("tied", [False, True])
def test_norms_of_lookup_tables_check_themselves(tied, directions, monkeypatch):
    """The ghost norms of a lookup table, and of a table tied to an output projection, come with each
    example's <g_i, V> from the same lookups and factors, checked against one backward pass of
    sum_i r_i loss_i. With the lookups' G read for the wrong examples, the check refuses the formula and
    the table is materialised: the norms stay right. A reader that takes no directions (as a plugin's may
    not) is asked for rows, checked the same way."""
    from unigrad_torch import _per_example_layers as torch_layers

    if not directions:
        monkeypatch.setattr(type(unigrad.get_backend("torch")), "per_example_directions", False)
    losses, params, idx = _lookup_model(tied)
    _, want = reference(losses, params, (idx,))
    norms_f = unigrad.per_example_grad_norms(losses, batch_argnum=1)
    torch.testing.assert_close(norms_f(params, idx), want, rtol=1e-10, atol=0)
    fast = (pe.SHARED if tied else pe.EMBEDDING_GHOST) if directions else (
        pe.SHARED_SUMMED if tied else pe.EMBEDDING)  # (rows: each use's, summed)
    assert norms_f.paths["argument 0['E']"] == fast, norms_f.paths

    real = torch_layers.Use._lookups

    def rolled(self, rec, g, batch):  # example i's lookups paired with example i-1's G
        idx, gs = real(self, rec, g, batch)
        return idx, gs.roll(1, 0)
    monkeypatch.setattr(torch_layers.Use, "_lookups", rolled)
    wrong = unigrad.per_example_grad_norms(losses, batch_argnum=1)
    torch.testing.assert_close(wrong(params, idx), want, rtol=1e-10, atol=0)
    assert set(wrong.paths.values()) == {pe.MATERIALISED}, wrong.paths


def test_rows_mixed_after_a_layer_are_materialised():
    """Batch norm in training mode (statistics over the batch) after a convolution and an embedding's
    output centred over the batch: those parameters materialised, values equal to the Jacobian rows;
    the layer after the mixing still takes the fast path."""
    torch.manual_seed(6)
    params = {"w": torch.randn(3, 2, 3, 3, dtype=DT), "E": torch.randn(6, 3, dtype=DT),
              "v": torch.randn(3, 2, 1, 1, dtype=DT)}
    x, idx = torch.randn(B, 2, 5, 5, dtype=DT), torch.randint(6, (B, 3))

    def losses(p, x, i):
        h = F.batch_norm(F.conv2d(x, p["w"]), None, None, training=True)  # (B, 3, 3, 3)
        e = F.embedding(i, p["E"])
        e = e - e.mean(0)
        h = h + e.sum(1)[:, :, None, None]
        return (torch.tanh(F.conv2d(h, p["v"].transpose(0, 1).contiguous())) ** 2).sum((1, 2, 3))

    pe_f = unigrad.per_example_grad(losses, batch_argnum=(1, 2))
    got = pe_f(params, x, idx)
    want = torch.func.jacrev(losses)(params, x, idx)
    for k in params:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
    assert pe_f.paths == {"argument 0['w']": pe.MATERIALISED, "argument 0['E']": pe.MATERIALISED,
                          "argument 0['v']": pe.MATERIALISED}  # (v goes through a transpose then a copy)

    def centred_after(p, x, i):  # the fast path would have used G of the whole batch here
        h = F.conv2d(x, p["w"])
        return ((h - h.mean(0)) ** 2).sum((1, 2, 3))

    pe_f = unigrad.per_example_grad(centred_after, batch_argnum=(1, 2))
    torch.testing.assert_close(pe_f(params, x, idx)["w"], torch.func.jacrev(centred_after)(params, x, idx)["w"],
                               rtol=1e-10, atol=1e-12)
    assert pe_f.paths["argument 0['w']"] == pe.MATERIALISED

    def over_the_batch(s, x):  # a layer norm over the batch axis too, its scale one entry per example
        return torch.tanh(F.layer_norm(x, x.shape, s)).sum(1)

    s, x2 = torch.randn(B, 3, dtype=DT), torch.randn(B, 3, dtype=DT)
    pe_f = unigrad.per_example_grad(over_the_batch)
    torch.testing.assert_close(pe_f(s, x2), torch.func.jacrev(over_the_batch)(s, x2), rtol=1e-10, atol=1e-12)
    assert pe_f.paths == {"argument 0": pe.MATERIALISED}


def test_value_overwritten_in_place_after_the_layer_is_not_read():
    """The layer's input changed in place after the layer: the one-pass rows would read the new values;
    instead the parameter is materialised, and torch's own check refuses the backward pass."""
    torch.manual_seed(7)
    w, x = torch.randn(4, 3, dtype=DT), torch.randn(B, 4, dtype=DT)

    def f(w, x):
        h = torch.tanh(x)
        y = h @ w
        h.mul_(3.0)
        return (y ** 2).sum(1) + h.sum(1)

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        unigrad.per_example_grad(f)(w, x)


def test_batched_jacobian_refuses_batch_norm_in_training_and_proves_convolutions():
    """The same rules behind batched_jacobian's proof: batch norm in training mode named as what mixes
    the rows; a strided convolution proved row-wise (its per-example Jacobians equal jacrev's blocks)."""
    torch.manual_seed(8)
    w, x = torch.randn(2, 3, 3, 3, dtype=DT), torch.randn(B, 3, 5, 5, dtype=DT)
    with pytest.raises(ValueError, match="native_batch_norm_training along the batch axis"):
        unigrad.batched_jacobian(lambda x: F.batch_norm(F.conv2d(x, w), None, None, training=True))(x)

    def conv(x):
        return torch.tanh(F.conv2d(x, w, stride=2, padding=1))

    full = torch.func.jacrev(conv)(x)
    blocks = unigrad.batched_jacobian(conv)(x)
    torch.testing.assert_close(blocks, torch.stack([full[i, :, :, :, i] for i in range(B)]), rtol=1e-12, atol=0)


def test_in_place_operations_after_layers():
    """ReLU(inplace=True) after convolutions, a residual ``h += x`` and a bias added in place: G at the
    value each layer made (its gradient edge, kept before the write), every parameter fast and right. A
    value changed through a view and then read through its base is not the recorded data flow: the
    parameter is materialised, and right."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.ReLU(inplace=True),
                                torch.nn.Conv2d(3, 2, 3), torch.nn.ReLU(inplace=True), torch.nn.Flatten(),
                                torch.nn.Linear(2 * 3 * 3, 3)).to(DT)
    params = {k: v.detach() for k, v in model.named_parameters()}
    params.update(w=torch.randn(3, 3, dtype=DT), b=torch.randn(3, dtype=DT))
    x, y = torch.randn(B, 2, 5, 5, dtype=DT), torch.randn(B, 3, dtype=DT)

    def losses(p, x, y):
        z = torch.func.functional_call(model, {k: v for k, v in p.items() if "." in k}, (x,))
        h = y @ p["w"]
        h += z
        h.add_(p["b"])
        return torch.tanh(h).sum(1)

    rows, _ = check(losses, params, x, y)
    assert rows == {"0.weight": pe.CONV, "0.bias": pe.BIAS, "2.weight": pe.CONV, "2.bias": pe.BIAS,
                    "5.weight": pe.DENSE, "5.bias": pe.BIAS, "w": pe.DENSE, "b": pe.BIAS}

    def through_view(p, x):
        h = x @ p["w"]
        h[:, 0].add_(h.mean(0)[1])  # rows mixed into column 0, written through a view of h
        return (h ** 2).sum(1)

    pe_f = unigrad.per_example_grad(through_view)
    torch.testing.assert_close(pe_f(params, y)["w"], torch.func.jacrev(through_view)(params, y)["w"],
                               rtol=1e-12, atol=1e-12)
    assert pe_f.paths["argument 0['w']"] == pe.MATERIALISED


def _jacobian_rows(model, params, x, batch):
    """The truth for a model whose losses share batch statistics: rows of the Jacobian of the loss vector with
    respect to the parameters, one plain torch.autograd backward pass per example (on a copy of the model)."""
    p = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    out = torch.func.functional_call(model, p, (x,))[:, 0] ** 2
    each = [torch.autograd.grad(out[i], list(p.values()), retain_graph=True) for i in range(batch)]
    return {k: torch.stack([e[j] for e in each]) for j, k in enumerate(p)}


@pytest.mark.parametrize("dims", [1, 2])
def test_batch_norm_in_training_mode_with_running_statistics(dims):
    """BatchNorm in training mode with running statistics (track_running_stats=True, the default): functorch
    raised its RuntimeError about an in-place write to a captured tensor. Each example's gradient is the
    gradient of its loss with the batch statistics depending on the whole batch (the Jacobian rows); f runs
    once, so the running statistics are those of one call of the model in training mode."""
    import copy

    torch.manual_seed(10)
    if dims == 1:
        model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(),
                                    torch.nn.Linear(6, 1))
        x = torch.randn(B, 5, dtype=DT)
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Tanh(),
                                    torch.nn.Flatten(), torch.nn.Linear(3 * 2 * 2, 1))
        x = torch.randn(B, 2, 4, 4, dtype=DT)
    model = model.to(DT).train()
    once = copy.deepcopy(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    want = _jacobian_rows(copy.deepcopy(model), params, x, B)  # (its copy's statistics are not compared)
    once(x)  # what one call of the model in training mode leaves in the buffers

    def losses(p, x):
        return torch.func.functional_call(model, p, (x,))[:, 0] ** 2

    rows_f = unigrad.per_example_grad(losses)
    got = rows_f(params, x)
    for k in params:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-12, msg=k)
    for (name, buf), (_, ref) in zip(model.named_buffers(), once.named_buffers()):
        torch.testing.assert_close(buf, ref, rtol=0, atol=0, msg=name)
    last = str(len(model) - 1)
    assert rows_f.paths[f"argument 0['{last}.weight']"] == pe.DENSE  # after the mixing: one backward pass
    assert rows_f.paths["argument 0['0.weight']"] == pe.MATERIALISED  # before it: the Jacobian rows
    norms = unigrad.per_example_grad_norms(losses)(params, x)
    torch.testing.assert_close(norms, torch.sqrt(sum((g.reshape(B, -1) ** 2).sum(1) for g in want.values())),
                               rtol=1e-10, atol=0)
    assert int(model[1].num_batches_tracked) == 2  # one update per call


def test_closed_over_write_with_a_backward_that_has_no_batching_rule():
    """The rows of this forward pass are vectorised over the examples' cotangents; a backward formula that
    cannot be (it reads a value) gets one backward pass per example, with the same numbers."""
    counter = torch.zeros((), dtype=DT)

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x ** 3

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            assert float(g.abs().sum()) >= 0.0  # a value read: vmap has no rule for it
            return 3 * x ** 2 * g

    def losses(w, x):
        counter.add_(1.0)  # written in place, closed over
        return Cube.apply(x @ w - (x @ w).mean(0)).sum(1)

    torch.manual_seed(11)
    w, x = torch.randn(3, 2, dtype=DT), torch.randn(B, 3, dtype=DT)
    got = unigrad.per_example_grad(losses)(w, x)
    want = torch.autograd.functional.jacobian(lambda w: (x @ w - (x @ w).mean(0)).pow(3).sum(1), w)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(counter) == 1.0


def test_batch_norm_in_training_mode_under_torch_func_is_a_clear_error():
    """Where the transform runs on torch.func (vjp, a forward-mode jacobian), a write into a captured tensor
    is a TypeError that names the operation and what to do. A reverse-mode jacobian records f once on plain
    autograd (as per_example_grad does): torch.autograd.functional.jacobian's values, and the running
    statistics moved as by one call of the model in training mode."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).to(DT).train()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(B, 3, dtype=DT)
    f = lambda p: torch.func.functional_call(model, p, (x,))  # noqa: E731
    for transform in (lambda: unigrad.vjp(f, params), lambda: unigrad.jacobian(f, mode="fwd")(params)):
        with pytest.raises(TypeError, match=r"wrote in place \(aten::add_.Tensor\).*running statistics.*model\.eval"):
            transform()
    twin = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).to(DT).train()
    twin.load_state_dict(model.state_dict())
    seen = int(model[1].num_batches_tracked)
    jac = unigrad.jacobian(f, mode="rev")(params)
    want = torch.autograd.functional.jacobian(lambda *v: torch.func.functional_call(twin, dict(zip(params, v)), (x,)),
                                              tuple(params.values()))
    for name, w in zip(params, want):
        torch.testing.assert_close(jac[name], w, rtol=1e-10, atol=1e-12)
    assert int(model[1].num_batches_tracked) == seen + 1
    torch.testing.assert_close(model[1].running_mean, twin[1].running_mean, rtol=0, atol=0)


def test_f_that_writes_into_a_parameter():
    """torch refused the write into the parameter (a leaf that requires grad); the parameter is materialised,
    f running on copies: loss_i = (2 w_i) ** 2, its gradient 8 w_i; the caller's tensor unchanged."""
    def losses(w, x):
        w.mul_(2.0)
        return (x @ w) ** 2

    w = torch.tensor([1.0, -2.0, 3.0], dtype=DT)
    got = unigrad.per_example_grad(losses)(w, torch.eye(3, dtype=DT))
    torch.testing.assert_close(got, torch.diag(8.0 * w), rtol=1e-12, atol=0)
    assert w.tolist() == [1.0, -2.0, 3.0]
