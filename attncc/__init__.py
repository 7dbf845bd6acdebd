"""attncc: a compiler from einsum-style attention specs to fast, verified GPU kernels."""

from attncc.api import compile, optimise
from attncc.flash_attn import flash_attn_func
from attncc.runtime.kernel import Kernel
from attncc.spec import SpecError, load
from attncc.varlen import varlen
from attncc.version import __version__

__all__ = [
    "Kernel",
    "SpecError",
    "__version__",
    "compile",
    "flash_attn_func",
    "load",
    "optimise",
    "varlen",
]
