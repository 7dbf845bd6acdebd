"""The source of ``attncc.fp8.quantize``'s Triton kernel (templates/triton/fp8_quantize.py.jinja):
not generated from a spec, so rendered once, with the FP8 constants its caller passes."""

from __future__ import annotations

import functools

from attncc.codegen.templating import environment


@functools.cache
def render(fp8_max: float, zero_block_descale: float) -> str:
    """The module's source: ``fp8_quantize_kernel`` and its helpers."""
    template = environment("triton").get_template("fp8_quantize.py.jinja")
    return template.render(fp8_max=fp8_max, zero_block_descale=zero_block_descale)
