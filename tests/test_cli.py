"""The ``unigrad`` command (``info``, ``check``, ``bench``) and the shipped examples."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import make_broken_backend, skip_unless

import unigrad
from unigrad._cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

MODULE = textwrap.dedent('''
    import numpy as np
    import unigrad

    def energy(x, w):
        xp = unigrad.namespace(x, w)
        return xp.sum(xp.tanh(xp.matmul(x, w)) ** 2)

    def energy_inputs():
        rng = np.random.default_rng(1)
        return rng.standard_normal((3, 2)), rng.standard_normal((2, 4))

    def make(seed=0):
        rng = np.random.default_rng(seed)
        return rng.standard_normal((2, 2)), rng.standard_normal((2, 3))

    def with_labels(x, labels):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * labels)

    def with_labels_inputs():
        return np.linspace(0.1, 1, 4), np.arange(4)

    def relu(x):
        xp = unigrad.namespace(x)
        return xp.maximum(x, xp.zeros_like(x))

    not_callable = 3
''')


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "functions.py"
    path.write_text(MODULE)
    return path


def run(argv):
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue()


def test_info():
    code, text = run(["info"])
    assert code == 0
    assert text.startswith(f"unigrad {unigrad.__version__}")
    numpy_row = next(line for line in text.splitlines() if line.startswith("numpy "))
    assert "yes" in numpy_row and "cpu" in numpy_row and "forward_mode" in numpy_row


def test_info_json():
    code, text = run(["info", "--json"])
    info = json.loads(text)
    assert code == 0 and info["unigrad"] == unigrad.__version__
    assert info["backends"]["numpy"]["available"] is True
    assert info["backends"]["numpy"]["capabilities"]["higher_order"] is True


def test_check_with_shapes(module):
    code, text = run(["check", f"{module}:energy", "--shapes", "3,2", "2x4", "--backends", "numpy"])
    assert code == 0, text
    assert "overall: agree" in text and "argnums (0, 1)" in text


def test_check_finds_the_inputs_function_beside_the_target(module):
    code, text = run(["check", f"{module}:energy", "--backends", "numpy", "--json"])
    report = json.loads(text)
    assert code == 0 and report["verdict"] == "agree"
    assert report["backends"][0]["output_shapes"] == [[]]
    assert report["function"] == f"{module}:energy"


def test_check_with_an_inputs_builder(module):
    code, text = run(["check", f"{module}:energy", "--inputs", "make", "--backends", "numpy", "--seed", "5",
                      "--json"])
    assert code == 0 and json.loads(text)["seed"] == 5
    code, text = run(["check", f"{module}:energy", "--inputs", f"{module}:make", "--backends", "numpy"])
    assert code == 0, text


def test_check_module_colon_function(module, monkeypatch):
    monkeypatch.chdir(module.parent)
    monkeypatch.syspath_prepend(str(module.parent))
    code, text = run(["check", "functions:energy", "--backends", "numpy", "--markdown"])
    assert code == 0, text
    assert "| backend | device |" in text and "Overall: **agree**" in text


def test_check_auto_argnums_skips_integer_arguments(module):
    code, text = run(["check", f"{module}:with_labels", "--backends", "numpy", "--json"])
    assert code == 0 and json.loads(text)["argnums"] == [0]
    code, text = run(["check", f"{module}:with_labels", "--backends", "numpy", "--argnums", "0,1"])
    assert code == 2  # integer labels cannot be differentiated: a usage error


def test_check_options(module):
    code, text = run(["check", f"{module}:energy", "--backends", "numpy", "--dtype", "float32", "--order", "2",
                      "--argnums", "1", "--repeat", "2", "--jacobian", "no"])
    assert code == 0, text
    assert "float32" in text and "2nd fd" in text and "Jac fd" not in text and "argnums (1,)" in text


def test_convention_difference_exits_zero(module, register_backend):
    from unigrad.tape import NumpyBackend
    from unigrad.tape import _namespace as xp

    class TorchLikeRelu(NumpyBackend):  # derivative 0 at a tie, like torch's relu
        name = "torchlike"
        array_modules = ()

        def namespace(self):
            ns = type(xp)("torchlike_namespace")
            ns.__dict__.update({k: v for k, v in vars(xp).items() if not k.startswith("__")})
            ns.maximum = lambda a, b, /: xp.where(a > b, a, b)
            return ns

    register_backend("torchlike", TorchLikeRelu)
    code, text = run(["check", f"{module}:relu", "--shapes", "3", "--backends", "numpy,torchlike"])
    assert code == 0  # random inputs: no kink, plain agreement
    path = module.parent / "at_zero.py"
    path.write_text(MODULE + "\ndef relu_inputs():\n    return (np.array([0.0, 1.0, -1.0]),)\n")
    code, text = run(["check", f"{path}:relu", "--backends", "numpy,torchlike"])
    assert code == 0, text
    assert "overall: convention difference" in text


@pytest.mark.parametrize("argv, message", [
    (["check", "{module}:energy", "--backends", "numpy", "--inputs", "nothing_here"], "no attribute 'nothing_here'"),
    (["check", "{module}:relu", "--backends", "numpy"], "no inputs for relu: pass --shapes"),
    (["check", "{module}:missing", "--backends", "numpy"], "has no attribute 'missing'"),
    (["check", "{module}:not_callable", "--backends", "numpy"], "'not_callable' is not callable"),
    (["check", "{module}", "--backends", "numpy"], "is not MODULE:FUNC"),
    (["check", "no/such/file.py:f"], "no such file"),
    (["check", "no_such_module_xyz:f"], "cannot import module 'no_such_module_xyz'"),
    (["check", "{module}:relu", "--shapes", "3,a"], "is not a shape"),
    (["check", "{module}:energy", "--argnums", "x"], "--argnums must be"),
])
def test_usage_errors(module, capsys, argv, message):
    argv = [a.replace("{module}", str(module)) for a in argv]
    code, _ = run(argv)
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("names, suggestion", [("numpy,pytorch", "did you mean 'torch'?"),
                                               ("Torch", "did you mean 'torch'?"),
                                               ("numpy,tf", "did you mean 'tensorflow'?"),
                                               ("nmupy", "did you mean 'numpy'?")])
def test_misspelt_backend_is_a_usage_error(module, capsys, monkeypatch, names, suggestion):
    import unigrad.testing

    called = []
    monkeypatch.setattr(unigrad.testing, "compare", lambda *a, **k: called.append(a))
    code, text = run(["check", f"{module}:energy", "--backends", names])
    assert code == 2 and not called and text == ""  # nothing was compared
    err = capsys.readouterr().err
    assert suggestion in err and "unknown backend" in err


def test_filtered_native_stderr_drops_only_tensorflows_start_up_notices(capfd):
    from unigrad._cli import _filtered_native_stderr

    with _filtered_native_stderr():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see ...\n")
        os.write(2, b"a real native error\n")
        print("from python", file=sys.stderr)
    err = capfd.readouterr().err
    assert "absl" not in err and "oneDNN" not in err
    assert "a real native error" in err and "from python" in err


def test_cli_runs_print_no_tensorflow_notices():
    skip_unless("tensorflow")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    code = ("import os, sys; from unigrad._cli import main; rc = main(['info']); "
            "import tensorflow as tf; "
            # oneDNN stays on: the numerics are TensorFlow's defaults, only the notices are gone
            "assert 'TF_ENABLE_ONEDNN_OPTS' not in os.environ; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "tensorflow  yes" in result.stdout
    assert "oneDNN" not in result.stderr and "absl::InitializeLog" not in result.stderr, result.stderr


def test_bench_runs_only_the_runner_beside_the_package(tmp_path, monkeypatch):
    from unigrad import _cli

    # someone else's checkout in the current directory: its benchmarks/run.py must never run
    (tmp_path / "benchmarks").mkdir()
    marker = tmp_path / "ran"
    (tmp_path / "benchmarks" / "run.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                    "def main(argv=None):\n    return 0\n")
    monkeypatch.chdir(tmp_path)
    runner = _cli.benchmark_runner()
    assert runner == Path(unigrad.__file__).resolve().parents[1] / "benchmarks" / "run.py"
    assert tmp_path not in runner.parents

    fake = tmp_path / "elsewhere" / "run.py"  # stands in for the real (slow) suite
    fake.parent.mkdir()
    fake.write_text("import sys\ndef main(argv=None):\n    print('runner got', argv)\n    return 0\n")
    monkeypatch.setattr(_cli, "benchmark_runner", lambda: fake)
    code, text = run(["bench", "--quick"])
    assert code == 0 and "runner got ['--quick']" in text
    assert not marker.exists()


def test_bench_without_a_source_tree_is_a_usage_error(tmp_path, monkeypatch, capsys):
    from unigrad import _cli

    monkeypatch.setattr(_cli, "__file__", str(tmp_path / "site-packages" / "unigrad" / "_cli.py"))
    code, _ = run(["bench"])
    assert code == 2 and "ships with unigrad's source tree" in capsys.readouterr().err


def _load_runner():
    import importlib.util

    spec = importlib.util.spec_from_file_location("unigrad_benchmark_runner_test", ROOT / "benchmarks" / "run.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return runner


def test_bench_says_which_ratios_are_too_noisy():
    runner = _load_runner()
    steady = runner.ratio_with_rounds([[1.00, 1.0], [1.02, 1.0], [1.01, 1.0]], 0, 1)
    noisy = runner.ratio_with_rounds([[0.15, 1.0], [0.21, 1.0], [0.40, 1.0]], 0, 1)
    assert float(steady) == 1.01 and float(noisy) == 0.21  # the figures themselves are unchanged
    results = {"tape": {"ratio": steady}, "batched_jacobian": {"torch": {"ratio": noisy, "native_seconds": 1e-3}}}
    table, warnings = runner.noise_report(results)
    assert table["tape.ratio"]["noisy"] is False and table["batched_jacobian.torch.ratio"]["noisy"] is True
    assert warnings == ["  batched_jacobian.torch.ratio = 0.21 is too noisy to read: its 3 rounds gave 0.15-0.40"]
    assert json.loads(json.dumps(results))["batched_jacobian"]["torch"]["ratio"] == 0.21
    # with many rounds, one spike does not make a ratio unreadable (the middle half of the rounds counts)
    spiky = runner.ratio_with_rounds([[1.0, 1.0]] * 9 + [[3.0, 1.0]], 0, 1)
    assert not spiky.noisy and spiky.spread == (1.0, 1.0)
    wide = runner.ratio_with_rounds([[0.8 + 0.05 * k, 1.0] for k in range(10)], 0, 1)
    assert wide.noisy and "the middle half of its 10 rounds" in runner.noise_report({"r": wide})[1][0]


def test_bench_draws_the_figures_from_saved_results(tmp_path):
    skip_unless("matplotlib")
    runner = _load_runner()
    results = {"tape": {"mlp_ratio_unigrad_vs_hand": 1.18, "mlp_ratio_autograd_vs_hand": 2.07,
                        "tiny_ratio_unigrad_vs_autograd": 0.45},
               "batched_jacobian": {"jax": {"ratio": 1.05}, "torch": {"ratio": 0.89}},
               "per_example": {"ratio_vs_torch_func": {"unigrad torch": 0.04, "Opacus": 1.4}},
               "noise": {"batched_jacobian.jax.ratio": {"low": 1.0, "high": 1.1}}}
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    assert runner.main(["--from-json", str(saved), "--plot", str(tmp_path / "figures")]) == 0
    for name in ("bench_tape.png", "bench_batched_jacobian.png", "bench_per_example.png"):
        assert (tmp_path / "figures" / name).read_bytes().startswith(b"\x89PNG")


def test_bench_only_runs_the_named_sections_and_keeps_the_rest_of_a_saved_run(tmp_path, monkeypatch, capsys):
    runner = _load_runner()
    ran = []

    def section(key, value):
        def run_it(state):
            ran.append(key)
            return {"ratio": runner.ratio_with_rounds([[value, 1.0]] * 3, 0, 1)}
        return key, f"section {key}", (), run_it, lambda results: None

    monkeypatch.setattr(runner, "SECTIONS", [section("tape", 1.2), section("calls", 1.4)])
    earlier = {"low": 8.0, "high": 10.0, "median": 9.0, "rounds": 3, "noisy": True}
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"tape": {"ratio": 9.0}, "calls": {"ratio": 9.0},
                                 "noise": {"tape.ratio": earlier, "calls.ratio": earlier}}))
    assert runner.main(["--only", "calls", "--json", str(saved)]) == 0
    data = json.loads(saved.read_text())
    assert ran == ["calls"]
    assert data["tape"] == {"ratio": 9.0} and data["noise"]["tape.ratio"] == earlier  # kept as it was
    assert data["calls"]["ratio"] == 1.4 and data["noise"]["calls.ratio"]["median"] == 1.4  # replaced
    with pytest.raises(SystemExit):
        runner.main(["--only", "tape,nonsense"])
    assert "unknown section(s) nonsense" in capsys.readouterr().err and ran == ["calls"]


def test_the_benchmark_modules_compute_their_ratios_through_the_runners_helper():
    runner = _load_runner()
    assert runner.bench_tape.ratio is runner.ratio_with_rounds
    assert runner.bench_batched_jacobian.ratio is runner.ratio_with_rounds


def test_check_conformance_runs_the_suite_pytest_runs():
    # the very tests of pytest --pyargs unigrad.testing.conformance, as a table of rules; exit 0
    code, text = run(["check", "--conformance", "numpy", "-k", "test_op and (sin or matmul) or unused_input"])
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("unigrad conformance: backend 'numpy'") and "--unigrad-backends=numpy" in lines[0]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:] if line and not line.startswith(" ")}
    assert int(rows["test_op"][0]) >= 3 and rows["test_unused_input_gets_zeros"] == ["1"], text
    assert lines[-1].startswith("overall: PASS")


def test_check_conformance_fails_a_broken_backend_as_pytest_does(register_backend):
    # before: the CLI ran the per-op table only and said PASS where pytest failed the backend
    cls = make_broken_backend("where_broadcast")
    name = register_backend(cls.name, cls)
    code, text = run(["check", "--conformance", name, "-k", "test_op and (where or sin)"])
    assert code == 1, text
    assert f"test_op[{name}-where]:" in text and f"test_op[{name}-sin]" not in text, text
    assert text.rstrip().splitlines()[-1].startswith("overall: FAIL (")
    code, text = run(["check", "--conformance", name, "-k", "no_such_test"])
    assert code == 1 and "no test ran" in text  # nothing collected is not a pass


@pytest.mark.parametrize("argv, message", [
    (["check", "--conformance", "pytorch"], "did you mean 'torch'?"),
    (["check", "--conformance", "numpy", "x.py:f"], "not both"),
    (["check"], "the function to check is missing"),
    (["check", "x.py:f", "-k", "sin"], "use it with --conformance"),
])
def test_check_conformance_usage_errors(monkeypatch, capsys, argv, message):
    from unigrad.testing import _suite

    monkeypatch.setattr(_suite, "run", lambda *a: pytest.fail("must not run"))
    code, _ = run(argv)
    assert code == 2 and message in capsys.readouterr().err


def test_python_dash_m_and_the_examples_on_the_tape():
    # a fresh process: the console entry point, the examples' input builders, exit status 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "unigrad", "check", "examples/mlp_loss.py:loss",
                             "--backends", "numpy"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "overall: agree" in result.stdout and "argnums (0, 1, 2)" in result.stdout


# The default run checks the README's target (mlp_loss: value, VJP, JVP and Jacobian on every backend) and the
# second-order one (jacobian_penalty: derivatives of per-example Jacobians, through batched_jacobian); the other
# targets run in the thorough job (marker slow): their examples run on every backend in test_examples.py, each
# asserting its own result (features against hand-written Jacobians, newton_cg's hvp against the Hessian).
_THOROUGH = [pytest.mark.slow]


@pytest.mark.parametrize("target", ["mlp_loss.py:loss",
                                    pytest.param("per_example_jacobian.py:features", marks=_THOROUGH),
                                    "per_example_jacobian.py:jacobian_penalty",
                                    pytest.param("linear_regression.py:loss", marks=_THOROUGH),
                                    pytest.param("newton_cg_hvp.py:logistic_loss", marks=_THOROUGH)])
def test_examples_check_on_every_installed_backend(unigrad_backends, target):
    # the penalty's derivatives go through batched_jacobian (second order): no full Jacobian of it, for time
    extra = ["--jacobian", "no"] if target.endswith("jacobian_penalty") else []
    code, text = run(["check", str(EXAMPLES / target), "--backends", ",".join(unigrad_backends), *extra])
    assert code == 0, text


def test_check_exit_status_for_an_inconclusive_verdict(monkeypatch, tmp_path, capsys):
    """Finite differences that cannot decide are not a disagreement: their own exit status, 3."""
    from unigrad import _cli
    from unigrad.testing import _compare

    module = tmp_path / "smooth_fn.py"
    module.write_text("import unigrad\n\ndef f(x):\n    return unigrad.namespace(x).sum(x * x)\n")
    monkeypatch.setattr(_compare.Comparison, "verdict", property(lambda self: _compare.INCONCLUSIVE))
    assert _cli.main(["check", f"{module}:f", "--shapes", "3", "--backends", "numpy"]) == _cli.EXIT_INCONCLUSIVE == 3
