"""A griffe extension for the API reference: unigrad's docstrings title their doctests ``Example:``
(Google style's admonition, which renders the ``>>>`` lines as one paragraph); this reads them as
Google style's ``Examples:`` section, which renders them as code. The docstrings themselves (and
the doctests run from them) are unchanged."""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        docstring = obj.docstring
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _EXAMPLE.sub(r"\1Examples:", docstring.value)
