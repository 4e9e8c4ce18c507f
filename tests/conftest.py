"""Shared test set-up: hypothesis profiles, optional extras, the uncached reference, and backends
with deliberately wrong derivatives.

Hypothesis profiles: ``ci`` (the default) runs few examples, with no deadline and without the example
database, seeded from the date (the same examples all day, new ones the next; the seed is in the
pytest header, and ``UNIGRAD_HYPOTHESIS_SEED=<seed>`` replays a run); ``thorough`` runs many
examples and raises every count a test pins (``examples(ci, thorough)``). Choose with
``UNIGRAD_HYPOTHESIS_PROFILE=thorough``.

Optional extras: ``requires``, ``skip_unless``, ``skip_module_unless`` and ``optional`` -- one rule,
one reason text (below). The uncached reference: ``uncached()``, every cache of the call path off.

Broken backends (fixture ``broken_backend``): subclasses of the NumPy tape whose namespace swaps
one operation for a copy with a wrong derivative rule. The primal values stay right, so only a
derivative check can notice. They prove that every checker can fail.
"""

from __future__ import annotations

import array
import contextlib
import datetime
import importlib
import inspect
import os
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=10, deadline=None, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("UNIGRAD_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def hypothesis_seed(environ=os.environ) -> int:
    """The seed of every hypothesis test without its own: ``UNIGRAD_HYPOTHESIS_SEED`` where set (to
    replay a run), else today's date in UTC as YYYYMMDD -- reproducible within a day, new examples
    the next (the seed is printed in the pytest header)."""
    value = environ.get("UNIGRAD_HYPOTHESIS_SEED")
    if value:
        return int(value)
    return int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d"))


HYPOTHESIS_SEED = hypothesis_seed()


def examples(ci: int, thorough: int | None = None) -> int:
    """A test's pinned number of examples: ``ci`` under the default profile; under ``thorough``, at
    least ``thorough`` (default: the profile's own count), never fewer than ``ci``."""
    if PROFILE != "thorough":
        return ci
    return max(ci, thorough if thorough is not None else settings.get_profile("thorough").max_examples)


# The conformance suite's budget of random programs per backend (its own default, 100, is for a plugin
# author's run): CONFORMANCE_PROGRAMS under the ci profile, unless --unigrad-programs is given. The
# suite's own bulk run of random programs on every backend (200 a day, drawn from the date's seed; 5,000
# under thorough) is tests/test_programs.py::test_random_programs_agree_across_backends; the thorough
# profile keeps 100 here.
CONFORMANCE_PROGRAMS = 20


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # hypothesis' own --hypothesis-seed wins; else the seed above, through that same option
    if getattr(config.option, "hypothesis_seed", "absent") is None:
        config.option.hypothesis_seed = str(HYPOTHESIS_SEED)
    given = any(a.startswith("--unigrad-programs") for a in config.invocation_params.args)
    if PROFILE != "thorough" and not given and hasattr(config.option, "unigrad_programs"):
        config.option.unigrad_programs = CONFORMANCE_PROGRAMS


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The cases a module lists in ``SLOW_CASES`` (test names with their ids, ``test_x[jax-compiled-custom_jvp]``)
    get the ``slow`` marker before ``-m`` selects: the cases of the ``backend`` fixture are made by the plugin, so
    they cannot carry a marker of their own. Each module says there what stays in the default run."""
    for item in items:
        slow = getattr(getattr(item, "module", None), "SLOW_CASES", ())
        if item.name in slow:
            item.add_marker(pytest.mark.slow)
        if getattr(item, "originalname", None) in getattr(getattr(item, "module", None), "FLOAT64_TESTS", ()):
            name = _backend_of(item)
            if name is not None and not _computes_float64(name):
                item.add_marker(pytest.mark.skip(
                    reason=f"{name} computes no float64 (capabilities.float64 False), and this test holds float64 "
                           f"results to float64's tolerances; the conformance suite checks {name} at float32"))


def _backend_of(item):
    """The backend name a parametrised case runs on (the ``backend`` fixture's, or a ``name`` parameter)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for key in ("unigrad_backend", "backend", "name"):
        if isinstance(params.get(key), str):
            return params[key]
    return None


def _computes_float64(name):
    import unigrad

    try:
        return unigrad.get_backend(name).capabilities.float64
    except Exception:  # not a backend (a parameter that happens to be called name): nothing to skip
        return True


def pytest_report_header(config):
    seed = getattr(config.option, "hypothesis_seed", None) or HYPOTHESIS_SEED
    return (f"unigrad: hypothesis profile {PROFILE!r}, seed {seed} "
            f"(replay with UNIGRAD_HYPOTHESIS_SEED={seed}; UNIGRAD_HYPOTHESIS_PROFILE=thorough for the long run)")


# ---------------------------------------------------------------------------------------------
# Optional extras: one rule
# ---------------------------------------------------------------------------------------------
# A test that uses an optional dependency says so where it uses it, with ``requires(...)`` (a
# marker) or ``optional(...)`` (the module, or None): where the module is missing the test is
# skipped, and the reason names the module and the extra that installs it; the other tests of its
# module still run. A module skips as a whole only when every test in it drives that dependency
# (the backend modules, test_backend_*.py).

EXTRAS = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow", "dask": "dask", "dask.array": "dask",
          "distributed": "dask", "cloudpickle": "dask", "array_api_strict": "test", "hypothesis": "test",
          "autograd": "test", "scipy": "test", "matplotlib": "docs", "mkdocs": "docs", "material": "docs",
          "mkdocstrings": "docs", "mkdocstrings_handlers.python": "docs"}
_IMPORTED: dict = {}


def optional(module: str):
    """The module, imported, or None where it is not installed (or fails to import)."""
    if module not in _IMPORTED:
        try:
            _IMPORTED[module] = importlib.import_module(module)
        except ImportError:
            _IMPORTED[module] = None
    return _IMPORTED[module]


def missing_reason(*modules: str) -> str | None:
    """Why a test needing ``modules`` cannot run here (None: it can)."""
    absent = [m for m in modules if optional(m) is None]
    if not absent:
        return None
    extras = sorted({EXTRAS[m] for m in absent if m in EXTRAS})
    install = " ".join([f"'unigrad[{e}]'" for e in extras] + sorted(m for m in absent if m not in EXTRAS))
    return f"needs {', '.join(absent)}, not installed (pip install {install})"


def requires(*modules: str):
    """A marker: skip the test where one of ``modules`` is missing (see :func:`missing_reason`)."""
    reason = missing_reason(*modules)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def skip_unless(*modules: str):
    """Inside a test: skip it now where one of ``modules`` is missing; else return the first module."""
    reason = missing_reason(*modules)
    if reason is not None:
        pytest.skip(reason)
    return optional(modules[0])


def skip_module_unless(module: str):
    """At the top of a module every test of which drives ``module``: the module, or the whole file
    skipped with the same reason as :func:`requires` gives."""
    reason = missing_reason(module)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    return optional(module)


# ---------------------------------------------------------------------------------------------
# The uncached reference
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def uncached():
    """Every cache of unigrad's call path off while the block runs, for a reference result that shares
    nothing with the transform under test: caches made in it store nothing (``UNIGRAD_NO_CACHE``,
    read when a cache is made), and existing ones (the module-level plan cache of ``vjp``) neither
    return nor store anything."""
    from unigrad._call import BoundedCache

    saved_env = os.environ.get("UNIGRAD_NO_CACHE")
    saved_get, saved_put = BoundedCache.get, BoundedCache.put
    os.environ["UNIGRAD_NO_CACHE"] = "1"
    BoundedCache.get = lambda self, key: None
    BoundedCache.put = lambda self, key, value: value
    try:
        yield
    finally:
        BoundedCache.get, BoundedCache.put = saved_get, saved_put
        if saved_env is None:
            os.environ.pop("UNIGRAD_NO_CACHE", None)
        else:
            os.environ["UNIGRAD_NO_CACHE"] = saved_env


def outcome(thunk):
    """``("ok", result)`` or ``("raised", exception type)``."""
    try:
        return "ok", thunk()
    except Exception as exc:  # noqa: BLE001 -- compared with what the reference raises
        return "raised", type(exc)


def key_orders(tree):
    if isinstance(tree, dict):
        return [list(tree)] + [o for v in tree.values() for o in key_orders(v)]
    if isinstance(tree, (tuple, list)):
        return [o for v in tree for o in key_orders(v)]
    return []


def assert_same(got, want):
    """The same structure (key order included), and leaves of the same type, dtype, shape and values."""
    import optree

    import unigrad

    (kind_got, got), (kind_want, want) = got, want
    assert kind_got == kind_want, f"the call {'raised ' + got.__name__ if kind_got == 'raised' else 'returned'}; " \
                                  f"a fresh transform {'raised ' + want.__name__ if kind_want == 'raised' else 'returned'}"
    if kind_got == "raised":
        assert got is want, (got, want)
        return
    leaves_got, tree_got = optree.tree_flatten(got)
    leaves_want, tree_want = optree.tree_flatten(want)
    assert tree_got == tree_want and str(tree_got) == str(tree_want), (tree_got, tree_want)
    assert key_orders(got) == key_orders(want)
    for a, b in zip(leaves_got, leaves_want):
        assert type(a) is type(b), (type(a), type(b))
        a, b = unigrad.to_numpy(a), unigrad.to_numpy(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def repeat_hits(monkeypatch):
    """The outcomes of the repeat lookups (``unigrad._repeats.Repeats``, the fast path of a compiled call that
    repeats a signature) made while the test runs: True for a hit. Spies on ``Repeats.call`` and on
    ``Repeats.run`` (grad's whole-call runners: a hit skips ``Repeats.call``, a miss goes on to it)."""
    from unigrad import _repeats

    seen = []
    real_call, real_run = _repeats.Repeats.call, _repeats.Repeats.run

    def spy_call(self, key, f, args, has_aux, fname):
        call = real_call(self, key, f, args, has_aux, fname)
        seen.append(call is not None)
        return call

    def spy_run(self, args, go=True):
        out = real_run(self, args, go)
        if go and type(out) is not _repeats.Miss:
            seen.append(True)
        return out

    monkeypatch.setattr(_repeats.Repeats, "call", spy_call)
    monkeypatch.setattr(_repeats.Repeats, "run", spy_run)
    return seen


# ---------------------------------------------------------------------------------------------
# Broken backends
# ---------------------------------------------------------------------------------------------

def _broken_namespace(name, **overrides):
    """A copy of the tape's namespace with some functions replaced (``linalg_inv`` replaces ``linalg.inv``)."""
    from unigrad.tape import _namespace as tape_namespace

    ns = types.ModuleType(f"broken_namespace_{name}")
    ns.__dict__.update({k: v for k, v in vars(tape_namespace).items() if not k.startswith("__")})
    linalg = {k.removeprefix("linalg_"): v for k, v in overrides.items() if k.startswith("linalg_")}
    ns.__dict__.update({k: v for k, v in overrides.items() if not k.startswith("linalg_")})
    if linalg:
        sub = types.ModuleType(f"broken_namespace_{name}.linalg")
        sub.__dict__.update({k: v for k, v in vars(tape_namespace.linalg).items() if not k.startswith("__")})
        sub.__dict__.update(linalg)
        ns.linalg = sub
    return ns


def _first_instead_of_sum(c, x, ans):
    """Reduce a cotangent to ``x``'s shape by taking the first entry of each broadcast axis
    instead of summing over it: the dropped-broadcast-sum bug (right shape, wrong values)."""
    from unigrad.tape._core import _ndim, _shape

    nb = _ndim(c) - _ndim(ans)
    xs, ans_shape = _shape(x), _shape(ans)
    lead = len(ans_shape) - len(xs)
    index = ((slice(None),) * nb + (0,) * lead
             + tuple(slice(0, 1) if s == 1 and a != 1 else slice(None) for s, a in zip(xs, ans_shape[lead:])))
    return c[index]


def make_broken_backend(bug: str):
    """A NumpyBackend subclass with one wrong derivative rule.

    Bugs:
      ``sin_scale``: d sin = 1.001 cos (off by 1e-3 relative; JVP and VJP both wrong, consistently).
      ``matmul_transposed``: the VJP of matmul for its first operand uses b instead of b^T
        (runs silently for square matrices; the JVP is right).
      ``broadcast_sum``: the VJP of multiply takes the first row of a broadcast axis instead of
        summing over it (the JVP is right).
      ``second_derivative``: sin's first derivative is right, but it is written with a cos whose own
        derivative has the wrong sign, so second derivatives are wrong.
      ``where_broadcast``: the VJP of ``where`` takes the first entry of a broadcast axis of x1 and x2
        instead of summing over it (right without broadcasting; the JVP is right).
      ``inv_no_jvp``: ``linalg.inv`` has no JVP rule, so its JVP is silently zero (the VJP is right) --
        a backend declaring forward mode that does not deliver it.
      ``det_vjp_transposed``: the VJP of ``linalg.det`` uses the cofactor matrix without its transpose
        (right for symmetric matrices only; the JVP is right).
    """
    from unigrad.tape import NumpyBackend
    from unigrad.tape import _namespace as xp
    from unigrad.tape import _primitives as P
    from unigrad.tape._core import Primitive

    if bug == "sin_scale":
        prim = Primitive("sin", np.sin, vjps=(lambda g, ans, x: g * (P.cos(x) * 1.001),),
                         jvps=(lambda t, ans, x: t * (P.cos(x) * 1.001),))
        overrides = {"sin": lambda x, /: prim(xp._arr(x))}
    elif bug == "matmul_transposed":
        prim = Primitive("matmul", np.matmul, vjps=(lambda g, ans, a, b: P.matmul(g, b), P.matmul.vjps[1]),
                         jvps=P.matmul.jvps, broadcasts=True)

        def matmul(x1, x2, /):
            if xp._ndim(x1) >= 2 and xp._ndim(x2) >= 2:
                return prim(xp._arr(x1), xp._arr(x2))
            return xp.matmul(x1, x2)
        overrides = {"matmul": matmul}
    elif bug == "broadcast_sum":
        prim = Primitive("multiply", np.multiply,
                         vjps=(lambda g, ans, x, y: _first_instead_of_sum(g * y, x, ans),
                               lambda g, ans, x, y: _first_instead_of_sum(g * x, y, ans)),
                         jvps=P.multiply.jvps, broadcasts=True)
        overrides = {"multiply": lambda x1, x2, /: prim(xp._arr(x1), xp._arr(x2))}
    elif bug == "second_derivative":
        wrong_cos = Primitive("cos", np.cos, vjps=(lambda g, ans, x: g * P.sin(x),),  # should be -sin
                              jvps=(lambda t, ans, x: t * P.sin(x),))
        prim = Primitive("sin", np.sin, vjps=(lambda g, ans, x: g * wrong_cos(x),),
                         jvps=(lambda t, ans, x: t * wrong_cos(x),))
        overrides = {"sin": lambda x, /: prim(xp._arr(x))}
    elif bug == "where_broadcast":
        prim = Primitive("where", np.where,
                         vjps=(None, lambda g, ans, c, x, y: _first_instead_of_sum(P.where(c, g, 0), x, ans),
                               lambda g, ans, c, x, y: _first_instead_of_sum(P.where(c, 0, g), y, ans)),
                         jvps=P.where.jvps, broadcasts=True)
        overrides = {"where": lambda condition, x1, x2, /: prim(xp.concrete(condition), xp._arr(x1), xp._arr(x2))}
    elif bug == "inv_no_jvp":
        prim = Primitive("inv", np.linalg.inv, vjps=P.inv.vjps, jvps=(None,))
        overrides = {"linalg_inv": lambda x, /: prim(xp._arr(x))}
    elif bug == "det_vjp_transposed":
        prim = Primitive("det", np.linalg.det,
                         vjps=(lambda g, ans, x: P.reshape(g, tuple(np.shape(g)) + (1, 1))
                               * P._mT(P._cofactor(x, ans)),), jvps=P.det.jvps)
        overrides = {"linalg_det": lambda x, /: prim(xp._arr(x))}
    else:
        raise ValueError(f"unknown bug {bug!r}")
    namespace = _broken_namespace(bug, **overrides)

    class Broken(NumpyBackend):
        name = f"broken_{bug}"
        array_modules = ()  # NumPy arrays and tape tracers already belong to "numpy"

        def namespace(self):
            return namespace

    Broken.__name__ = Broken.__qualname__ = f"Broken_{bug}"
    return Broken


BUGS = ("sin_scale", "matmul_transposed", "broadcast_sum", "second_derivative")
# Bugs the conformance suite must catch (tests/test_conformance.py), beyond BUGS.
CONFORMANCE_BUGS = ("where_broadcast", "inv_no_jvp", "det_vjp_transposed")


@pytest.fixture
def register_backend():
    """``register_backend(name, factory)``: registered for this test only."""
    import unigrad

    names = []

    def register(name, factory):
        unigrad.register_backend(name, factory)
        names.append(name)
        return name

    yield register
    for name in names:
        unigrad.unregister_backend(name)


@pytest.fixture
def broken_backend(request, register_backend):
    """The name of a registered broken backend; parametrise indirectly with a name from BUGS."""
    cls = make_broken_backend(request.param)
    return register_backend(cls.name, cls)


class Counted:
    """``fn`` that counts how often it runs (a compiled or traced program runs it once per trace).

    The count is an ``array.array`` the object holds, a library type that the Python-state walk
    (``unigrad._pystate``) reads by identity: eager TensorFlow keeps its traced programs per value of the
    Python state ``f`` reads, an object's attributes and its class's included, and a count read as a value
    that changes on every call would be state that changes (a new trace per call)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "counted")
        self.__signature__ = inspect.signature(fn)  # static_argnames reads f's parameter names
        self.counter = array.array("q", [0])

    def __call__(self, *args):
        self.counter[0] += 1
        return self.fn(*args)

    @property
    def calls(self):
        return self.counter[0]


def row_verdict(program, ndim, batch):
    """"free", "row", "mixed: <why>" or "unknown: <why>" for a traced program whose first input has the
    batch (``batch`` rows) on axis 0 of its ``ndim`` axes: the dependence tests' one reading of a proof,
    whichever front-end (fx, TensorFlow graph) made the program."""
    from unigrad.dependence import prove_rows
    from unigrad.dependence._rows import _walk

    env = {program.inputs[0]: -ndim}
    _walk(program, env, batch)
    if all(v is None or v not in env for v in program.outputs):
        return "free"
    kind, detail = prove_rows(program, batch)
    if kind == "mixed":
        return "mixed: " + detail.describe()
    return kind if kind == "row" else f"unknown: {detail}"


FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow")


def framework_imports(path):
    """``[(line, module)]``: where ``path`` imports a framework -- import statements anywhere (functions
    included), ``__import__`` / ``importlib.import_module`` of one, and ``sys.modules[...]`` lookups of one."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and ast.unparse(node.value).endswith("modules")):
            names = [str(node.slice.value)]
        found += [(node.lineno, n) for n in names if n.partition(".")[0] in FRAMEWORKS]
    return found
