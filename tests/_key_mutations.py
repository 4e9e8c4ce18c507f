"""Deliberate mutations of the call-plan keys: a pytest plugin for the slow mutation test of
``tests/test_call_keys.py`` (``test_dropping_a_component_is_caught``). Not a test module.

Loaded with ``-p _key_mutations`` (``tests/`` on ``PYTHONPATH``) and ``UNIGRAD_KEY_MUTATION`` set
to one signature component; it makes unigrad ignore that component when it keys what it caches:

- ``structure``, ``shapes``, ``dtypes``, ``static``: that part of the signature built by
  ``unigrad._signature.arguments`` is blanked in every ``Key``;
- ``backend``, ``devices``: left out of the ``Key`` that ``prepare`` builds;
- ``argnums``: the plans are shared by every transform of one kind (one plan cache per transform
  name instead of one per transform), so a key that does not hold ``argnums`` is looked up;
- ``has_aux``, ``compile``: the public transforms are memoised on their function and options
  except that one (a transform cache that forgot it).

At the end of the session it writes ``{"applied": <mutated keys or transforms used>, "failed":
[node ids]}`` to ``UNIGRAD_KEY_MUTATION_REPORT``.
"""

from __future__ import annotations

import json
import os
import sys

COMPONENT = os.environ.get("UNIGRAD_KEY_MUTATION")
_STATE = {"applied": 0, "failed": []}
_BLANK = "<dropped>"


def _signature_parts(sig):
    """``[(kind, item)]`` for a signature tuple built by ``unigrad._signature.arguments``: kinds
    ``structure`` (tree structures, dict key orders), ``type``, ``shapes``, ``dtypes`` and ``static``."""
    import optree

    parts, items, i = [], list(sig), 0
    while i < len(items):
        item = items[i]
        if isinstance(item, optree.PyTreeSpec):
            parts.append(("structure", item))
            i += 1
            if "{" in repr(item) and i < len(items):  # the dict key orders follow the structure
                parts.append(("structure", items[i]))
                i += 1
        elif isinstance(item, type) and i + 2 < len(items):  # an array leaf: type, shape, dtype
            parts += [("type", item), ("shapes", items[i + 1]), ("dtypes", items[i + 2])]
            i += 3
        else:
            parts.append(("static", item[0] if isinstance(item, tuple) and item else type(item)))
            parts.append(("static-value", item))
            i += 1
    return parts


def _drop_from_signature(sig, component):
    if sig is None:
        return None
    kind = {"static": "static-value"}.get(component, component)
    return tuple(_BLANK if k == kind else v for k, v in _signature_parts(sig))


def _replace_everywhere(old, new):
    """Rebind every ``unigrad.*`` module's reference to ``old`` (``from ._call import prepare``)."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "unigrad" or name.startswith("unigrad.")):
            continue
        for attr, value in list(vars(module).items()):
            if value is old:
                setattr(module, attr, new)


def _mutate_key(component):
    from unigrad import _call

    real = _call.Key

    class MutantKey(real):
        __slots__ = ()

        def __init__(self, items):
            _STATE["applied"] += 1
            b, device, sig = items
            if component == "backend":
                b = _BLANK
            elif component == "devices":
                device = _BLANK
            else:
                sig = _drop_from_signature(sig, component)
            real.__init__(self, (b, device, sig))

    _call.Key = MutantKey  # prepare looks Key up in its module when it runs (and Key.__eq__ compares types)


def _share_plans():
    from unigrad import _call

    real = _call.prepare
    shared = {}

    def prepare(plans, f, args, argnums, has_aux, backend, fname, device=None):
        _STATE["applied"] += 1
        plans = shared.setdefault(fname, _call.BoundedCache(plans.kind, 64))
        return real(plans, f, args, argnums, has_aux, backend, fname, device)

    _replace_everywhere(real, prepare)


def _memoise_transforms(option):
    import unigrad

    made = {}
    for name in ("grad", "value_and_grad", "jacobian", "jacrev", "jacfwd", "hessian", "batched_jacobian"):
        real = getattr(unigrad, name)

        def transform(f, *args, _real=real, _name=name, **kwargs):
            # the first transform made for (f, the options without ``option``) serves all of them
            key = (_name, f, repr(args), repr(sorted((k, v) for k, v in kwargs.items() if k != option)))
            if key in made:
                _STATE["applied"] += 1
                return made[key]
            return made.setdefault(key, _real(f, *args, **kwargs))

        setattr(unigrad, name, transform)


def pytest_configure(config):
    if not COMPONENT:
        return
    if COMPONENT in ("structure", "shapes", "dtypes", "static", "backend", "devices"):
        _mutate_key(COMPONENT)
    elif COMPONENT == "argnums":
        _share_plans()
    elif COMPONENT in ("has_aux", "compile"):
        _memoise_transforms(COMPONENT)
    else:
        raise ValueError(f"UNIGRAD_KEY_MUTATION={COMPONENT!r}: not a signature component")


def pytest_runtest_logreport(report):
    if report.failed:
        _STATE["failed"].append(report.nodeid)


def pytest_sessionfinish(session):
    path = os.environ.get("UNIGRAD_KEY_MUTATION_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump(_STATE, fh)
