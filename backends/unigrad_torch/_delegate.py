"""The module-level ``__getattr__`` / ``__dir__`` of a namespace module that is an
``array_api_compat`` module except for the names it defines itself."""

from __future__ import annotations

import sys


def delegate(module_name: str, compat, own):
    """``(__getattr__, __dir__)`` for module ``module_name``: a name it does not define is ``compat``'s,
    found once (then stored as a plain module attribute, so later lookups cost nothing)."""
    namespace = sys.modules[module_name].__dict__

    def __getattr__(name):
        value = getattr(compat, name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(dir(compat)) | set(own))

    return __getattr__, __dir__
