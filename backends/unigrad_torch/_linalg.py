"""``linalg`` of the torch backend's namespace: ``array_api_compat.torch.linalg``, except that the
functions of a Hermitian (real symmetric) matrix read its Hermitian part ``(x + x^H) / 2``.

torch's own read one triangle (the lower): their value ignores the other triangle, yet their
backward returns a symmetric gradient and their forward mode uses the whole tangent, so VJP and JVP
disagree for a tangent that is not symmetric (the transpose test fails). Reading the Hermitian part
is what the tape, JAX (``symmetrize_input=True``) and TensorFlow's namespace do: for a Hermitian
input the value is unchanged, and the derivative is that of a function of every entry, the
gradient symmetric (docs/conventions.md).
"""

from __future__ import annotations

import array_api_compat.torch.linalg as _compat

from ._delegate import delegate

__all__ = ["cholesky", "eigh", "eigvalsh"]


__getattr__, __dir__ = delegate(__name__, _compat, __all__)


def _hermitian_part(x, fname):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{fname}: expected a (stack of) square matrices; got shape {tuple(x.shape)}")
    return (x + x.mH) / 2


def cholesky(x, /, *, upper=False):
    return _compat.cholesky(_hermitian_part(x, "cholesky"), upper=upper)


def eigh(x, /):
    return _compat.eigh(_hermitian_part(x, "eigh"))


def eigvalsh(x, /):
    return _compat.eigvalsh(_hermitian_part(x, "eigvalsh"))
