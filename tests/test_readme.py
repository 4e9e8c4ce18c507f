"""The README stays true: its Quick start has exactly two commands, and its Python example runs."""

from __future__ import annotations

import pathlib
import re

import pytest

from conftest import skip_unless

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_quick_start_has_two_commands_and_ci_runs_the_second():
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1]
    commands = [ln for ln in _blocks(quick, "bash")[0].splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(commands) == 2
    assert "unigrad check" in commands[0] and "pytest" in commands[1]
    # the test command installs the worked plugin, so CI runs the conformance suite on it
    assert "-e plugins/unigrad_autograd" in commands[1]
    assert "plugins/unigrad_mlx[cpu]" in commands[1]  # and on the fifth engine, MLX
    for plugin in ("unigrad_autograd", "unigrad_mlx"):
        assert (README.parent / "plugins" / plugin / "pyproject.toml").is_file()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "README.md" in ci and "sed -n 2p" in ci


def test_python_example_runs():
    skip_unless("torch")
    code = _blocks(README.read_text(), "python")[0]
    namespace = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["per_example"].shape == (4, 2, 3)
    import numpy as np

    np.testing.assert_allclose(namespace["g"], namespace["g_torch"].numpy(), rtol=1e-12)
