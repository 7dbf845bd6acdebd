"""Register each compiled kernel as a torch custom op, so ``torch.compile`` traces it whole.

The op takes the inputs in declaration order, each param as an optional scalar (None means
the spec's default) and ``return_lse``; it always returns ``(out, lse)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attncc.codegen.exprs import safe_name
from attncc.ir.nodes import AttentionKernel

_LIBRARY = torch.library.Library("attncc", "FRAGMENT")  # type: ignore[no-untyped-call]
_REGISTERED: dict[str, Any] = {}


def _schema(kernel: AttentionKernel) -> str:
    args = [f"Tensor t_{safe_name(t.name)}" for t in kernel.tensors]
    for p in kernel.params:
        scalar = "float" if p.type == "float" else "int"
        args.append(f"{scalar}? p_{safe_name(p.name)}=None")
    args.append("bool return_lse=False")
    return f"({', '.join(args)}) -> (Tensor, Tensor)"


def register(
    kernel: AttentionKernel,
    key: str,
    run: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    fake: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> Any:
    """The op ``torch.ops.attncc.<name>_<key>``, registered once per process."""
    op_name = f"{safe_name(kernel.name)}_{key}"
    if op_name not in _REGISTERED:
        _LIBRARY.define(op_name + _schema(kernel))  # type: ignore[no-untyped-call]
        _LIBRARY.impl(op_name, run, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"attncc::{op_name}", fake, lib=_LIBRARY)
        _REGISTERED[op_name] = getattr(torch.ops.attncc, op_name).default
    return _REGISTERED[op_name]
