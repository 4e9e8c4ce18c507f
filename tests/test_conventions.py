"""Non-differentiable points: the tape's documented rules, and docs/conventions.md matches a measurement."""

from __future__ import annotations

import pathlib

import pytest

import unigrad
from unigrad.testing import conventions

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "conventions.md"

# The tape's rule at each point (docs/tape.md); a change here is a change of documented behaviour.
TAPE_RULES = {
    "abs at 0": "0", "relu at 0": "0.5", "maximum(0, x) at 0": "0.5", "minimum(x, 0) at 0": "0.5",
    "minimum(0, x) at 0": "0.5", "native relu at 0": "0", "maximum tie": "0.5, 0.5",
    "maximum tie, swapped": "0.5, 0.5", "minimum tie": "0.5, 0.5", "minimum tie, swapped": "0.5, 0.5",
    "max reduction tie": "[0.5, 0.5, 0]", "max of empty": "error: ValueError",
    "median, even count": "error: AttributeError", "clip lower bound": "1", "clip upper bound": "1",
    "sqrt at 0": "inf", "norm at 0": "[0, 0]", "safe_norm at 0": "[0, 0]", "where, NaN in untaken branch": "rev nan / fwd 0",
    "where, log trap": "rev nan / fwd 0", "safe_where": "0", "x ** 0 at 0": "0", "pow(x, 0.0) at 0": "0", "x ** int 0 at 0": "0", "pow, base 0": "0",
    "pow, negative base": "nan", "pow, negative base, both": "-4, nan", "pow, base 0, both": "inf, 0", "floor": "0", "round": "0", "sign at 0": "0",
}

# The rules unigrad promises on every backend (docs/conventions.md, "The rules chosen"): the backends
# that already follow them must keep doing so.
PROMISED = {
    "x ** int 0 at 0": ("0", ["numpy", "torch", "jax"]),
    "x ** 0 at 0": ("0", ["numpy", "torch"]),  # JAX's operator: NaN, not ours to change
    "pow(x, 0.0) at 0": ("0", ["numpy", "torch", "jax"]),
    "abs at 0": ("0", ["numpy", "torch", "jax", "tensorflow"]),
    "clip lower bound": ("1", ["numpy", "torch", "jax", "tensorflow"]),
    "clip upper bound": ("1", ["numpy", "torch", "jax", "tensorflow"]),
    "norm at 0": ("[0, 0]", ["numpy", "torch", "jax", "tensorflow"]),
    "pow, negative base": ("nan", ["numpy", "torch", "jax", "tensorflow"]),
    # one value in reverse and forward mode (tensorflow's forward mode gave 1 / 0 at ties until the
    # namespace recorded its own JVP)
    "relu at 0": ("0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "maximum(0, x) at 0": ("0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "minimum(x, 0) at 0": ("0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "minimum(0, x) at 0": ("0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "maximum tie": ("0.5, 0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "maximum tie, swapped": ("0.5, 0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "minimum tie": ("0.5, 0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "minimum tie, swapped": ("0.5, 0.5", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    # (mlx's forward mode gave [1, 0, 0] until its namespace's max / min split ties themselves)
    "max reduction tie": ("[0.5, 0.5, 0]", ["numpy", "torch", "jax", "tensorflow", "autograd", "mlx"]),
    "pow, negative base, both": ("-4, nan", ["numpy", "tensorflow"]),  # torch, JAX, autograd: fwd nan, nan
    "pow, base 0, both": ("inf, 0", ["numpy", "tensorflow"]),
    "max of empty": ("error: ValueError", ["numpy", "torch", "jax"]),
    "median, even count": ("[0, 0.5, 0.5, 0]", ["torch", "jax"]),
    "where, log trap": ("rev nan / fwd 0", ["numpy", "torch", "jax", "tensorflow"]),  # the documented trap
    "safe_where": ("0", ["numpy", "torch", "jax", "tensorflow"]),
    "safe_norm at 0": ("[0, 0]", ["numpy", "torch", "jax", "tensorflow"]),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_tape_rules_at_non_differentiable_points():
    measured = conventions.measure(["numpy"])
    assert {k: v["numpy"] for k, v in measured.items()} == TAPE_RULES


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_conventions_doc_is_what_the_backends_return_now():
    documented = conventions.parse(DOC.read_text())
    available = [n for n, info in unigrad.backends().items() if info["available"]]
    measured = conventions.measure(available)
    expressions = {k.name: k.expression for k in conventions.KINKS}
    for name, row in measured.items():
        for backend, cell in row.items():
            doc_row = documented[expressions[name]]
            if backend in doc_row:  # a backend not installed here is not checked
                assert doc_row[backend] == cell, (
                    f"docs/conventions.md says {backend} gives {doc_row[backend]} for {expressions[name]}, "
                    f"but it now gives {cell}: regenerate with python -m unigrad.testing.conventions --write")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_promised_rules_hold_on_every_backend_that_follows_them():
    available = [n for n, info in unigrad.backends().items() if info["available"]]
    names = {name for name in PROMISED}
    kinks = [k for k in conventions.KINKS if k.name in names]
    measured = conventions.measure(available, kinks=kinks)
    for name, (cell, backends) in PROMISED.items():
        for backend in backends:
            if backend in available:
                assert measured[name][backend] == cell, (name, backend)


def test_the_doc_has_one_row_per_measured_point_and_says_how_to_regenerate():
    text = DOC.read_text()
    documented = conventions.parse(text)
    assert list(documented) == [k.expression for k in conventions.KINKS]
    assert "python -m unigrad.testing.conventions --write docs/conventions.md" in text


def test_measure_catches_a_changed_rule(monkeypatch):
    from unigrad.tape import _primitives as P

    monkeypatch.setattr(P.absolute, "vjps", (lambda g, ans, x: g * 1.0,))  # abs'(0) := 1, not 0
    assert conventions.measure(["numpy"])["abs at 0"]["numpy"] == "rev 1 / fwd 0"  # the modes now differ


def test_the_doc_is_what_render_writes():
    """docs/conventions.md is generated whole (python -m unigrad.testing.conventions --write): text added by
    hand outside unigrad/testing/conventions.py's render would be lost at the next regeneration."""
    text = DOC.read_text()
    names = {k.expression: k.name for k in conventions.KINKS}
    table = {names[expression]: row for expression, row in conventions.parse(text).items()}
    measured_with = next(line for line in text.splitlines() if line.startswith("Measured with: "))
    versions = dict(item.split(" ", 1) for item in measured_with[len("Measured with: "):].rstrip(".").split(", "))
    assert conventions.render(table, versions) == text, (
        "docs/conventions.md differs from what render() writes: edit the text in unigrad/testing/conventions.py "
        "and regenerate")
