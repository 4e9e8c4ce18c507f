"""The dependence analysis's torch.fx front-end: ATen graphs traced by make_fx, read by the one rule table.

Each op class answers FREE (no dependence on the batch), ROW (row i depends on input row i only), MIXED
(with the operation named) or unknown (no rule: the proof gives up, never guesses)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from unigrad.dependence import prove_rows  # noqa: E402
from unigrad_torch._dependence import fx_program  # noqa: E402
from conftest import row_verdict  # noqa: E402

B = 5
W = torch.randn(4, 3)
LIN = torch.nn.Linear(3, 2)


def verdict(f, x):
    """"free", "row", "mixed: <why>" or "unknown: <why>" for f(x) with x's rows the batch."""
    return row_verdict(fx_program(make_fx(f)(x)), x.dim(), B)


X2 = torch.randn(B, 4)
X3 = torch.randn(B, 6, 4)
X4 = torch.randn(B, 2, 6, 6)
LABELS = torch.randint(3, (B,))
CW = torch.randn(4, 1, 3, 3)
IDX = torch.randint(B, (3, 2))

CASES = [
    # FREE: no derivative flows (comparisons, factories, detach)
    ("compare", lambda x: (x > 0).float().sum(1), X2, "free"),
    ("like", lambda x: torch.ones_like(x).sum(1), X2, "free"),
    ("detach", lambda x: x.detach().mean(0).expand(B, 4).sum(1), X2, "free"),
    # ROW: elementwise, products with a constant, reductions and lanes off the batch axis, structure
    ("elementwise", lambda x: torch.tanh(x) * 2 + torch.exp(x) / (1 + x ** 2), X2, "row"),
    ("mm", lambda x: x @ W, X2, "row"),
    ("linear over positions", lambda x: F.linear(x[..., :3], LIN.weight, LIN.bias).sum((1, 2)), X3, "row"),
    ("bmm", lambda x: torch.bmm(x, x.transpose(1, 2)).sum((1, 2)), X3, "row"),
    ("sum axis 1", lambda x: x.sum(1), X2, "row"),
    ("softmax last", lambda x: torch.log_softmax(x, -1).sum(1), X2, "row"),
    ("cross-entropy none", lambda x: F.cross_entropy(x[:, :3], LABELS, reduction="none"), X2, "row"),
    ("gather", lambda x: torch.gather(x, 1, LABELS[:, None])[:, 0], X2, "row"),
    ("layer norm", lambda x: F.layer_norm(x, (4,)).sum(1), X2, "row"),
    ("reshape keeps", lambda x: x.reshape(B, 2, 12).sum((1, 2)), X3, "row"),
    ("permute", lambda x: x.permute(1, 0, 2).sum((0, 2)), X3, "row"),
    ("cat axis 1", lambda x: torch.cat([x, x * 2], 1).sum(1), X2, "row"),
    ("flip axis 1", lambda x: x.flip(1).sum(1), X2, "row"),
    ("where", lambda x: torch.where(x > 0, x, x * x).sum(1), X2, "row"),
    ("batch merged inside", lambda x: (x.transpose(0, 1).reshape(-1, 4) @ W).reshape(6, B, 3).sum((0, 2)), X3,
     "row"),  # (6, B, 4) -> (6*B, 4): the batch the inner factor, then split back
    # per example: convolutions, poolings, group norm, batch norm in eval mode
    ("conv2d", lambda x: F.conv2d(x, CW, stride=2, padding=1, groups=2).sum((1, 2, 3)), X4, "row"),
    ("max pool", lambda x: F.max_pool2d(x, 2).sum((1, 2, 3)), X4, "row"),
    ("reflect pad, upsample", lambda x: F.interpolate(F.pad(x, (1, 1, 1, 1), mode="reflect"), scale_factor=2)
     .sum((1, 2, 3)), X4, "row"),
    ("group norm", lambda x: F.group_norm(x, 2).sum((1, 2, 3)), X4, "row"),
    ("batch norm eval", lambda x: F.batch_norm(x, torch.zeros(2), torch.ones(2)).sum((1, 2, 3)), X4, "row"),
    # MIXED: the batch axis reduced, scanned, contracted, moved
    ("mean over batch", lambda x: (x - x.mean(0)).sum(1), X2, "mixed: mean over the batch axis"),
    ("softmax over batch", lambda x: torch.softmax(x, 0).sum(1), X2, "mixed: _softmax along the batch axis"),
    ("cumsum over batch", lambda x: torch.cumsum(x, 0).sum(1), X2, "mixed: cumsum along the batch axis"),
    ("contract batch", lambda x: (x @ (x.T @ x)).sum(1), X2, "mixed: matmul contracts the batch axis"),
    ("mean loss", lambda x: F.cross_entropy(x[:, :3], LABELS).expand(B), X2,
     "mixed: nll_loss_reduced over the batch axis"),
    ("flip batch", lambda x: x.flip(0).sum(1), X2, "mixed: flip moves or combines rows of the batch"),
    ("merge batch", lambda x: x.reshape(-1).sum().expand(B), X2, "mixed: sum over the batch axis"),
    ("merged inside, split wrongly", lambda x: x.transpose(0, 1).reshape(-1, 4).reshape(B, 24).sum(1), X3,
     "mixed: reshape moves or combines rows of the batch"),
    ("batch norm training", lambda x: F.batch_norm(x, None, None, training=True).sum((1, 2, 3)), X4,
     "mixed: native_batch_norm_training along the batch axis"),
    ("conv across batch", lambda x: F.conv2d(x.transpose(0, 1), torch.ones(B, B, 1, 1)).sum((0, 2, 3)), X4,
     "mixed: convolution acts across the batch axis"),
    # unknown: no rule (the caller materialises or probes)
    ("sort", lambda x: torch.sort(x, 0)[0].sum(1), X2, "unknown: no row rule for the primitive 'sort'"),
    ("embedding of rows", lambda x: F.embedding(IDX, x).sum((1, 2)).repeat(2)[:B], X2,
     "unknown: embedding with a row-dependent operand 0"),
]


@pytest.mark.parametrize("name, f, x, want", CASES, ids=[c[0] for c in CASES])
def test_rule_per_op_class(name, f, x, want):
    assert verdict(f, x) == want


def test_addmm_and_bias_are_two_nodes_of_the_table():
    """addmm(c, a, b) is read as a product then a sum: a row-dependent bias broadcast over the batch
    is caught like any other broadcast."""
    program = fx_program(make_fx(lambda x: torch.addmm(x[:, 1:], x, W).sum(1))(X2))
    names = [n.name for n in program.nodes]
    assert "aten.mm" in names and "aten.add" in names and "aten.addmm" not in names
    assert prove_rows(program, B)[0] == "row"
    program = fx_program(make_fx(lambda x: torch.addmm(x[0, :3], x, W).sum(1))(X2))
    assert prove_rows(program, B)[0] == "mixed"


def test_index_values_decide_only_when_known():
    """An index built from literal arguments (arange) is folded and read; one computed from the
    input is not known, and the rule gives up."""
    idx = torch.tensor([1, 0, 3])
    assert verdict(lambda x: x[:, torch.arange(3)].sum(1), X2) == "row"
    assert verdict(lambda x: x[:, idx].sum(1), X2).startswith("unknown")  # a constant whose value is not read


def test_batch_merged_with_positions_and_split_back():
    """A sequence loss that reshapes (B, T, C) to (B*T, C), takes a per-position loss and reshapes
    back keeps rows apart; one that reduces or reorders the merged axis does not."""
    y = torch.randint(4, (B * 6,))
    assert verdict(lambda x: F.cross_entropy(x.reshape(-1, 4), y, reduction="none").reshape(B, -1).sum(1),
                   X3) == "row"
    assert verdict(lambda x: torch.tanh(x.reshape(-1, 4)).sum(1).reshape(B, 6).sum(1), X3) == "row"
    assert verdict(lambda x: torch.log_softmax(x.reshape(-1, 4), 0).reshape(B, -1).sum(1), X3) == \
        "mixed: _log_softmax along the batch axis"
    assert verdict(lambda x: x.reshape(-1, 4).flip(0).reshape(B, -1).sum(1), X3).startswith("mixed: flip")
    assert verdict(lambda x: x.reshape(-1, 4)[:B].sum(1), X3).startswith("mixed")
