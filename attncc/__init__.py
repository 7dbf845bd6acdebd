"""attncc: a compiler from einsum-style attention specs to fast, verified GPU kernels."""

__version__ = "0.1.0"

from attncc.api import compile, optimise
from attncc.runtime.kernel import Kernel
from attncc.spec import SpecError, load

__all__ = ["Kernel", "SpecError", "__version__", "compile", "load", "optimise"]
