"""Register each compiled kernel as a torch custom op, so ``torch.compile`` traces it whole.

The op takes the inputs in declaration order, each param as an optional scalar (None means
the spec's default) and ``return_lse``; it always returns ``(out, lse)``.

The kernels have no backward yet. Without an autograd kernel of its own, a call on inputs
that require grad would fall through to PyTorch's "autograd not implemented" fallback: the
output requires grad, ``backward()`` runs, and every input's ``.grad`` stays None (only a
UserWarning says so). The op's autograd kernel refuses such calls before launching instead;
with grad mode off or no input requiring grad it passes straight through.
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


def no_backward_error(kernel_name: str, inputs: list[str]) -> NotImplementedError:
    """The error of a call that autograd would have to differentiate through."""
    needs = ", ".join(f"'{name}'" for name in inputs)
    return NotImplementedError(
        f"attncc {kernel_name}: no backward yet, but input{'s' if len(inputs) > 1 else ''} "
        f"{needs} require{'' if len(inputs) > 1 else 's'} grad; call the kernel under "
        "torch.no_grad() or torch.inference_mode(), or pass detached inputs"
    )


def _refuse_autograd(kernel: AttentionKernel, op_name: str) -> Callable[..., Any]:
    names = [t.name for t in kernel.tensors]

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            needs = [n for n, t in zip(names, args, strict=False) if t.requires_grad]
            raise no_backward_error(kernel.name, needs)
        # as PyTorch's own autograd kernels do (torch/_library/autograd.py): run the kernels
        # below autograd with the keys this call already has
        with torch._C._AutoDispatchBelowAutograd():
            below = keyset & torch._C._after_autograd_keyset
            return _REGISTERED[op_name].redispatch(below, *args, **kwargs)

    return autograd_kernel


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
        _LIBRARY.impl(  # type: ignore[no-untyped-call]
            op_name, _refuse_autograd(kernel, op_name), "Autograd", with_keyset=True
        )
        torch.library.register_fake(f"attncc::{op_name}", fake, lib=_LIBRARY)
        _REGISTERED[op_name] = getattr(torch.ops.attncc, op_name).default
    return _REGISTERED[op_name]
