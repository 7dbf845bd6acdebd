"""attncc: a compiler from einsum-style attention specs to fast, verified GPU kernels."""

__version__ = "0.1.0"

from attncc.api import compile, optimise  # noqa: E402
from attncc.runtime.kernel import Kernel  # noqa: E402
from attncc.spec import SpecError, load  # noqa: E402

__all__ = ["Kernel", "SpecError", "__version__", "compile", "load", "optimise"]
