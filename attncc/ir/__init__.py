"""The attention IR: nodes, lowering from a checked spec, verifier and printer."""

from attncc.ir.lower import lower
from attncc.ir.nodes import AttentionKernel
from attncc.ir.printer import expr_str, kernel_str
from attncc.ir.verify import IRError, verify

__all__ = ["AttentionKernel", "IRError", "expr_str", "kernel_str", "lower", "verify"]
