"""TensorFlow's own special functions (``tf.math``) for :mod:`unigrad.special`, behind the Array boundary
(they take and, inside ``f``, return the adapter's arrays). ``ndtr``, ``log_ndtr``, ``logit``, ``betaln`` and
``multigammaln`` are left to unigrad.special's formulas."""

from __future__ import annotations

import tensorflow as tf

from ._array import _boundary


def _polygamma(n, x):
    return tf.math.polygamma(tf.cast(n, x.dtype), x)


FUNCTIONS = {name: _boundary(fn) for name, fn in {
    "gammaln": tf.math.lgamma, "digamma": tf.math.digamma, "polygamma": _polygamma, "erf": tf.math.erf,
    "erfc": tf.math.erfc, "erfinv": tf.math.erfinv, "ndtri": tf.math.ndtri, "expit": tf.math.sigmoid,
    "xlogy": tf.math.xlogy, "xlog1py": tf.math.xlog1py, "i0e": tf.math.bessel_i0e, "i1e": tf.math.bessel_i1e,
}.items()}
