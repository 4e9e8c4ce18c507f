"""What torch says when ``f`` writes into a leaf that requires grad (one floor under the adapter and its
per-example module, which both recognise it: the transforms then run ``f`` on copies)."""

from __future__ import annotations

import re

#: torch's refusal of an in-place write into a leaf that requires grad (raised before anything is written)
LEAF_WRITE = re.compile(r"a (view of a )?leaf Variable that requires grad is being used in an in-place operation")
