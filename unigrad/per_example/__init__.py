"""Per-example gradients with respect to shared parameters, and their norms (``per_example_grad``,
``per_example_grad_norms``): the transform (``_transform``), the tape's rows read from its recording
(``_tape``), and the layer rules every engine's ``per_example_rows`` builds on (:mod:`.layers`, public for
backends)."""

from ._transform import per_example_grad, per_example_grad_norms

__all__ = ["per_example_grad", "per_example_grad_norms"]
