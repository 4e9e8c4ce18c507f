"""unigrad's TensorFlow backend: ``unigrad.grad(f, backend="tensorflow")``.

Registered as ``tensorflow`` through the ``unigrad.backends`` entry point; the
Array API namespace for TensorFlow tensors is ``unigrad_tensorflow.namespace``
(what ``unigrad.namespace(tensor)`` returns). Inside a transform, ``f`` receives
:class:`Array` s: the tensors with the Array API's operators and attributes.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from . import _namespace  # noqa: E402
from ._array import Array, public_module  # noqa: E402

namespace = public_module(_namespace, __name__ + ".namespace")

from ._backend import TensorflowBackend  # noqa: E402

__all__ = ["Array", "TensorflowBackend", "namespace"]
