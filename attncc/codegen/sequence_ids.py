"""The source of ``attncc.varlen``'s sequence-id kernel (templates/triton/sequence_ids.py.jinja):
not generated from a spec, so rendered once."""

from __future__ import annotations

import functools

from attncc.codegen.templating import environment


@functools.cache
def render() -> str:
    """The module's source: ``sequence_ids_kernel`` and its helpers."""
    return environment("triton").get_template("sequence_ids.py.jinja").render()
