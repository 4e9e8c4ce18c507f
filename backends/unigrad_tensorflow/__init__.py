"""unigrad's TensorFlow backend: ``unigrad.grad(f, backend="tensorflow")``.

Registered as ``tensorflow`` through the ``unigrad.backends`` entry point; the
Array API namespace for TensorFlow tensors is ``unigrad_tensorflow.namespace``
(what ``unigrad.namespace(tensor)`` returns): its functions return :class:`Array` s -- tensors with
the Array API's operators and attributes -- wherever they are called, and a transform's ``f``
receives :class:`Array` s. Transforms return plain ``tf.Tensor`` s; ``unigrad.to_native(a)`` or
``tf.convert_to_tensor(a)`` gives the tensor an :class:`Array` holds.
"""


from ._array import Array, namespace  # noqa: E402
from ._backend import TensorflowBackend  # noqa: E402

__all__ = ["Array", "TensorflowBackend", "namespace"]
