"""The conformance suite (unigrad.testing.conformance) on every installed backend (--unigrad-backends)."""

from unigrad.testing.conformance import *  # noqa: F401,F403
