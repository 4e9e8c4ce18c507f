"""The ``unigrad`` command: ``info``, ``check`` and ``bench``.

``unigrad info``                       backends, versions, devices, capabilities (``--json``)
``unigrad check FILE.py:FUNC``         FUNC's value and derivatives on every installed backend, against
``unigrad check MODULE:FUNC``          each other and finite differences; exit status 0 when they
                                       agree (or differ only by a convention at a kink), 1 when not
``unigrad check A.py:F@torch B.py:G@jax``  two (or more) implementations of one function, each on its
                                       backend, compared in values and derivatives leaf by leaf
                                       (``unigrad.testing.compare_implementations``); one set of inputs
``unigrad check --conformance NAME``   the conformance suite (the tests pytest runs with
                                       ``--unigrad-backends=NAME``) as a table of rules; exit 0 when every
                                       test passed (skips allowed), 1 when not; ``-k EXPR`` selects tests
``unigrad bench``                      the benchmark suite (benchmarks/run.py beside the installed package:
                                       a source checkout; never a file of the current directory)

Inputs for ``check``, in order of precedence:
  ``--inputs FILE.py:BUILDER`` (or ``MODULE:BUILDER``, or ``BUILDER`` beside FUNC): a function
  returning the tuple of arguments (it may take a ``seed`` keyword);
  ``--shapes 3,4 4``: one random normal array per shape (``()`` or ``scalar`` for 0-d), of ``--dtype``;
  otherwise a function named ``FUNC_inputs`` beside FUNC (the convention the examples follow).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["main"]

EXIT_OK, EXIT_DISAGREE, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3


class UsageError(Exception):
    """A problem with the command line: reported without a traceback, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Loading functions
# ---------------------------------------------------------------------------------------------

def _split_target(spec: str):
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise UsageError(f"{spec!r} is not MODULE:FUNC or path/to/file.py:FUNC")
    return module, attr


def _load_module(module: str):
    """A module by dotted name, or a Python file by path (its directory goes on sys.path for its imports)."""
    path = Path(module)
    if module.endswith(".py") or path.exists() or os.sep in module or "/" in module:
        if not path.is_file():
            raise UsageError(f"no such file: {module}")
        path = path.resolve()
        name = "unigrad_cli_" + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
        if name in sys.modules:
            return sys.modules[name]
        directory = str(path.parent)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception:
            del sys.modules[name]
            raise
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current directory import
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import module {module!r}: {exc}") from None


def _get_attr(mod, attr: str, what: str):
    obj = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{what}: {getattr(mod, '__file__', mod.__name__)} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{what}: {attr!r} is not callable")
    return obj


def load_target(spec: str):
    """``(function, module)`` for ``MODULE:FUNC`` or ``path.py:FUNC``."""
    module, attr = _split_target(spec)
    mod = _load_module(module)
    return _get_attr(mod, attr, spec), mod, attr


def _parse_shape(text: str):
    text = text.strip()
    if text in ("", "()", "scalar", "0d", "0-d"):
        return ()
    text = text.strip("()[]").replace("x", ",")
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--shapes: {text!r} is not a shape like 3,4 or () for 0-d") from None


def build_inputs(args, mod, attr):
    """The tuple of arguments for the checked function (see the module docstring for the precedence)."""
    if args.inputs:
        if ":" in args.inputs:
            builder_mod, builder_attr = _split_target(args.inputs)
            builder = _get_attr(_load_module(builder_mod), builder_attr, "--inputs")
        else:
            builder = _get_attr(mod, args.inputs, "--inputs")
        return _call_builder(builder, args.seed)
    if args.shapes:
        rng = np.random.default_rng(args.seed)
        dtype = np.dtype(args.dtype or "float64")
        out = []
        for text in args.shapes:
            shape = _parse_shape(text)
            x = rng.standard_normal(shape)
            if dtype.kind == "c":
                x = x + 1j * rng.standard_normal(shape)
            out.append(np.asarray(x).astype(dtype))
        return tuple(out)
    conventional = attr.rpartition(".")[2] + "_inputs"
    builder = getattr(mod, conventional, None)
    if builder is None:
        raise UsageError(f"no inputs for {attr}: pass --shapes (e.g. --shapes 3,4 4), --inputs FILE.py:BUILDER, "
                         f"or define {conventional}() beside {attr}")
    return _call_builder(builder, args.seed)


def _call_builder(builder, seed):
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        params = {}
    result = builder(seed=seed) if "seed" in params else builder()
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _auto_argnums(inputs):
    """Every argument whose leaves are all floating or complex arrays (or Python floats): the one default
    of check_grads, compare and assert_backends_agree."""
    from .testing._check_grads import floating_argnums

    try:
        return floating_argnums(inputs, "unigrad check")
    except TypeError:
        raise UsageError("no argument holds only floating-point arrays to differentiate; pass --argnums") from None


# ---------------------------------------------------------------------------------------------
# Backend names, and loading frameworks without their start-up noise
# ---------------------------------------------------------------------------------------------

# Names people reach for that are too far from the real ones for difflib alone.
_ALIASES = {"pytorch": "torch", "tf": "tensorflow", "np": "numpy", "tape": "numpy", "jnp": "jax"}
_FIRST_PARTY = ("numpy", "torch", "jax", "tensorflow")


def _known_backend_names() -> list[str]:
    import unigrad

    names = list(unigrad.backends(load=False))
    return names + [n for n in _FIRST_PARTY if n not in names]


def _did_you_mean(name: str, known) -> str:
    lowered = name.lower()
    if lowered in known:
        return f"; did you mean {lowered!r}? (names are lower case)"
    if lowered in _ALIASES and _ALIASES[lowered] in known:
        return f"; did you mean {_ALIASES[lowered]!r}?"
    close = difflib.get_close_matches(lowered, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_backend_names(names, option: str):
    """Raise a UsageError naming the first unknown backend in ``names``, with the closest known name."""
    known = _known_backend_names()
    for name in names:
        if name not in known:
            raise UsageError(f"{option}: unknown backend {name!r}{_did_you_mean(name, known)} "
                             f"(known: {', '.join(sorted(known))})")


def _backend_list(text: str) -> list[str] | str:
    if text.strip() == "all":
        return "all"
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--backends: expected comma-separated backend names or 'all'")
    _check_backend_names(names, "--backends")
    return names


# What TensorFlow writes to file descriptor 2 while its shared libraries load. Two of them each
# carry their own copy of absl and of TensorFlow's port.cc (libtensorflow_framework.so.2 and
# python/profiler/internal/_pywrap_profiler_plugin.so), and each copy's static initialiser logs the
# oneDNN notice through an absl that nobody has initialised -- absl then writes every message to
# stderr, whatever TF_CPP_MIN_LOG_LEVEL says: two lines, twice per process. They are notices, not
# errors; turning oneDNN off (TF_ENABLE_ONEDNN_OPTS=0) would silence them by changing the numerics,
# so instead the CLI drops exactly these lines and passes anything else through.
_NATIVE_NOISE = ("All log messages before absl::InitializeLog() is called are written to STDERR",
                 "oneDNN custom operations are on")


@contextlib.contextmanager
def _filtered_native_stderr():
    """Capture what native code writes to file descriptor 2; on exit, write it back minus the
    known start-up notices (Python's own ``sys.stderr`` is flushed first and keeps its order)."""
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(noise in line for noise in _NATIVE_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _load_backends(names):
    """Load the named backends (``"all"``: every registered one) with TensorFlow's notices filtered
    out. A backend that fails to load is left for the command itself to report."""
    import unigrad

    with _filtered_native_stderr():
        if names == "all":
            unigrad.backends(load=True)
            return
        for name in names:
            try:
                unigrad.get_backend(name)
            except (ImportError, ValueError, TypeError):
                pass


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def cmd_info(args, out) -> int:
    import unigrad

    _load_backends("all")
    report = unigrad.backends(load=True)  # (loaded above: the report of each load)
    if args.json:
        print(json.dumps({"unigrad": unigrad.__version__, "python": platform.python_version(),
                          "numpy": np.__version__, "backends": report}, indent=2, default=str), file=out)
        return EXIT_OK
    print(f"unigrad {unigrad.__version__}  (Python {platform.python_version()}, NumPy {np.__version__})", file=out)
    rows = [("backend", "available", "version", "devices", "capabilities")]
    notes = []
    for name, info in report.items():
        if info["available"]:
            caps = ", ".join(k for k, v in (info["capabilities"] or {}).items() if v)
            rows.append((name, "yes", str(info["version"]), ", ".join(info["devices"] or ()), caps))
        else:
            rows.append((name, "no", "", "", ""))
            notes.append(f"  {name}: {info['error']}")
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
        if k == 0:
            print("  ".join("-" * w for w in widths), file=out)
    if notes:
        print("\nunavailable:", file=out)
        for line in notes:
            print(line, file=out)
    return EXIT_OK


def cmd_check(args, out) -> int:
    if args.conformance is not None:
        if args.target:
            raise UsageError("pass either MODULE:FUNC or --conformance NAME, not both")
        return cmd_conformance(args.conformance, out, args.k)
    if args.k is not None:
        raise UsageError("-k selects tests of the conformance suite: use it with --conformance NAME")
    if not args.target:
        raise UsageError("the function to check is missing: MODULE:FUNC or path/to/file.py:FUNC "
                         "(or --conformance NAME for a backend)")
    if len(args.target) > 1 or "@" in args.target[0]:
        return cmd_check_implementations(args, out)
    args.target = args.target[0]
    from .testing import compare

    backends = _backend_list(args.backends)
    _load_backends(backends)
    with _filtered_native_stderr():  # the target's module may import a framework of its own
        f, mod, attr = load_target(args.target)
        inputs = build_inputs(args, mod, attr)
    argnums = _argnums(args.argnums, inputs)
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
    try:
        report = compare(f, inputs, backends=backends, devices=devices, argnums=argnums, dtype=args.dtype,
                         seed=args.seed, order=args.order, reference=args.reference,
                         jacobian={"auto": "auto", "yes": True, "no": False}[args.jacobian], repeats=args.repeat)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    report.function = args.target
    return _report(report, args, out)


def _argnums(text, inputs):
    if text in (None, "auto"):
        return _auto_argnums(inputs)
    if text == "all":
        return tuple(range(len(inputs)))
    try:
        return tuple(int(a) for a in text.split(",") if a.strip())
    except ValueError:
        raise UsageError(f"--argnums must be 'auto', 'all' or integers like 0,1; got {text!r}") from None


def cmd_check_implementations(args, out) -> int:
    """``unigrad check A:F@BACKEND B:G@BACKEND ...``: compare_implementations on one set of inputs."""
    if args.reference is not None or args.backends != "all" or args.devices.count(",") > 0:
        raise UsageError("with several MODULE:FUNC@BACKEND targets, each target names its backend: --backends, "
                         "--reference and several --devices do not apply")
    specs = []
    for spec in args.target:
        target, sep, backend = spec.rpartition("@")
        if not sep or not target or not backend:
            raise UsageError(f"{spec!r}: comparing implementations needs MODULE:FUNC@BACKEND for each target "
                             f"(e.g. model_torch.py:forward@torch model_jax.py:forward@jax)")
        specs.append((spec, target, backend))
    if len(specs) < 2:
        raise UsageError(f"{args.target[0]!r}: comparing implementations needs at least two targets "
                         "MODULE:FUNC@BACKEND (one target without @BACKEND is checked on every backend)")
    _check_backend_names([b for _, _, b in specs], "MODULE:FUNC@BACKEND")
    _load_backends([b for _, _, b in specs])
    from .testing import compare_implementations

    impls = {}
    with _filtered_native_stderr():  # the targets' modules import their frameworks
        for spec, target, backend in specs:
            f, mod, attr = load_target(target)
            if spec in impls:
                raise UsageError(f"{spec!r} is given twice")
            impls[spec] = (backend, f)
            if len(impls) == 1:
                first = (mod, attr)
        inputs = build_inputs(args, *first)
    try:
        report = compare_implementations(impls, inputs, argnums=_argnums(args.argnums, inputs), dtype=args.dtype,
                                         seed=args.seed, order=args.order, device=args.devices.strip(),
                                         jacobian={"auto": "auto", "yes": True, "no": False}[args.jacobian],
                                         repeats=args.repeat)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return _report(report, args, out)


def cmd_conformance(name: str, out, select: str | None = None) -> int:
    """The conformance suite for one backend, run by pytest in this process (the same tests as
    ``pytest --pyargs unigrad.testing.conformance --unigrad-backends=NAME``), as a table: 0 when every
    test passed, 1 when not."""
    _check_backend_names([name], "--conformance")
    _load_backends([name])
    from .testing import _suite

    out.flush()
    table, ok = _suite.run(name, select)
    print(table, file=out)
    return EXIT_OK if ok else EXIT_DISAGREE


def benchmark_runner() -> Path:
    """``benchmarks/run.py`` of the source tree this very ``unigrad`` package sits in.

    Only that one location: a file in the current directory is never executed (``unigrad bench`` run
    in someone else's checkout must not run their code). A wheel install has no benchmark suite.
    """
    runner = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"
    if not runner.is_file():
        raise UsageError(f"the benchmark suite ships with unigrad's source tree, not with the installed package "
                         f"(no {runner}): install unigrad from a checkout (pip install -e .) to run it")
    return runner


def cmd_bench(args, out) -> int:
    """Run the suite's runner in this process (so it measures this very unigrad)."""
    runner = benchmark_runner()
    spec = importlib.util.spec_from_file_location("unigrad_benchmark_runner", runner)
    module = importlib.util.module_from_spec(spec)
    with _filtered_native_stderr():
        spec.loader.exec_module(module)
        names = [n for n in ("jax", "torch", "tensorflow") if n in _known_backend_names()]
        _load_backends(names)
    argv = (["--quick"] if args.quick else []) + (["--json", args.json] if args.json else [])
    with contextlib.redirect_stdout(out):
        return module.main(argv)


def _parser():
    parser = argparse.ArgumentParser(prog="unigrad", description="One autodiff interface over many engines.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="installed backends: versions, devices, capabilities")
    info.add_argument("--json", action="store_true", help="machine-readable output")

    check = sub.add_parser(
        "check", help="compare a function's derivatives across backends and with finite differences",
        description="Evaluate FUNC's value, VJP, JVP and Jacobian on every backend, compare them with each "
                    "other and with finite differences, print the table and exit 0 if they agree (or "
                    "differ only by a convention at a non-differentiable point), 1 if not, 3 if finite "
                    "differences cannot decide at this point (no backend is wrong there: try other inputs).")
    check.add_argument("target", nargs="*",
                       help="MODULE:FUNC or path/to/file.py:FUNC; or two or more MODULE:FUNC@BACKEND: "
                            "implementations of one function, each on its backend, compared with each other "
                            "(inputs: those of the first target)")
    check.add_argument("--conformance", metavar="NAME",
                       help="instead of a function: run the conformance suite against backend NAME (the tests "
                            "pytest runs with --unigrad-backends=NAME) and print a table of its rules (exit 0 "
                            "when every test passes, 1 when not)")
    check.add_argument("-k", metavar="EXPR", help="with --conformance: only the tests matching this pytest -k "
                                                  "expression (e.g. 'test_op and sin')")
    check.add_argument("--shapes", nargs="+", metavar="SHAPE",
                       help="one random normal input per shape, e.g. --shapes 3,4 4 (() for 0-d)")
    check.add_argument("--inputs", metavar="BUILDER",
                       help="FILE.py:FUNC, MODULE:FUNC or a name beside the target: returns the arguments "
                            "(default: TARGET_inputs beside the target)")
    check.add_argument("--dtype", help="cast floating inputs to this dtype (float64, float32, complex128...)")
    check.add_argument("--backends", default="all", help="comma-separated backend names, or all (default)")
    check.add_argument("--devices", default="cpu", help="comma-separated devices: cpu, cuda, cuda:1, gpu")
    check.add_argument("--argnums", default="auto",
                       help="arguments to differentiate: 0,1 / all / auto (every all-floating argument; default)")
    check.add_argument("--seed", type=int, default=0, help="seed of the random inputs and directions")
    check.add_argument("--order", type=int, choices=(1, 2), default=1, help="2 also checks the JVP of the VJP")
    check.add_argument("--reference", help="backend the others are compared with (default numpy)")
    check.add_argument("--jacobian", choices=("auto", "yes", "no"), default="auto",
                       help="compute full Jacobians (auto: when small)")
    check.add_argument("--repeat", type=int, default=1,
                       help="after the timed first call, time each quantity this many more times (the steady "
                            "state; the best is kept); 0 times the first call only")
    fmt = check.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output")
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table")

    bench = sub.add_parser("bench", help="the benchmark suite (ratios against native and peer implementations)")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv=None, out=None) -> int:
    """Entry point of the ``unigrad`` console script and ``python -m unigrad``; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process is ours: keep TensorFlow's logs quiet
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    command = {"info": cmd_info, "check": cmd_check, "bench": cmd_bench}[args.command]
    try:
        return command(args, out)
    except UsageError as exc:
        print(f"unigrad {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())


def _report(report, args, out) -> int:
    """Print a comparison's report as ``args`` asks (JSON, Markdown or the table); the exit code of its verdict."""
    from .testing._compare import INCONCLUSIVE

    if args.json:
        print(report.to_json(), file=out)
    elif args.markdown:
        print(report.to_markdown(), file=out)
    else:
        print(report.table(), file=out)
    if report.ok:
        return EXIT_OK
    return EXIT_INCONCLUSIVE if report.verdict == INCONCLUSIVE else EXIT_DISAGREE
