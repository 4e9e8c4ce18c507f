"""unigrad's TensorFlow backend: ``unigrad.grad(f, backend="tensorflow")``.

Registered as ``tensorflow`` through the ``unigrad.backends`` entry point; the
Array API namespace for TensorFlow tensors is ``unigrad_tensorflow.namespace``
(what ``unigrad.namespace(tensor)`` returns).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from . import _namespace as namespace  # noqa: E402
from ._backend import TensorflowBackend  # noqa: E402

__all__ = ["TensorflowBackend", "namespace"]
