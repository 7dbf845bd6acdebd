"""Register each compiled kernel as a torch custom op, so ``torch.compile`` traces it whole.

The op takes the inputs in declaration order, each param as an optional scalar (None means
the spec's default) and ``return_lse``; it always returns ``(out, lse)``.

Kernels with a backward (fused prefill, ``attncc.runtime.autograd``) register it with
``torch.library.register_autograd``: the forward saves the inputs, the output and the
log-sum-exp, and the backward is a second op, ``<name>_<key>_bwd``, returning the gradient of
every float input, so ``torch.compile`` traces forward and backward whole.

Kernels without one (split-KV, naive, specs whose derivative cannot be generated): without an
autograd kernel of their own, a call on inputs that require grad would fall through to
PyTorch's "autograd not implemented" fallback: the output requires grad, ``backward()`` runs,
and every input's ``.grad`` stays None (only a UserWarning says so). The op's autograd kernel
refuses such calls before launching instead, naming why there is no backward; with grad mode
off or no input requiring grad it passes straight through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attncc.codegen.exprs import safe_name
from attncc.ir.nodes import AttentionKernel

_LIBRARY = torch.library.Library("attncc", "FRAGMENT")  # type: ignore[no-untyped-call]
_REGISTERED: dict[str, Any] = {}


def _scalar_type(param_type: str) -> str:
    """A param's schema type: integer params are SymInt, so a compiled caller may pass one it
    traces symbolically (a cache's length as a query offset) without pinning the graph to
    its value."""
    return "float" if param_type == "float" else "SymInt"


def _schema(kernel: AttentionKernel) -> str:
    args = [f"Tensor t_{safe_name(t.name)}" for t in kernel.tensors]
    for p in kernel.params:
        args.append(f"{_scalar_type(p.type)}? p_{safe_name(p.name)}=None")
    args.append("bool return_lse=False")
    return f"({', '.join(args)}) -> (Tensor, Tensor)"


def no_backward_error(reason: str, inputs: list[str]) -> NotImplementedError:
    """The error of a call that autograd would have to differentiate through; ``reason``
    says why the kernel has no backward ("attncc NAME: no backward for this spec: ...")."""
    needs = ", ".join(f"'{name}'" for name in inputs)
    return NotImplementedError(
        f"{reason}, but input{'s' if len(inputs) > 1 else ''} "
        f"{needs} require{'' if len(inputs) > 1 else 's'} grad; call the kernel under "
        "torch.no_grad() or torch.inference_mode(), or pass detached inputs"
    )


@dataclass(frozen=True)
class BackwardOps:
    """A kernel's backward: ``run`` and ``fake`` take the forward's inputs and params, the
    output, the log-sum-exp, the gradients of both and which gradients are needed, and
    return the gradients of the inputs named ``floats`` (in that order; empty where not
    needed)."""

    run: Callable[..., list[torch.Tensor]]
    fake: Callable[..., list[torch.Tensor]]
    floats: tuple[str, ...]


# The keysets below autograd (ADInplaceOrView aside) of plain CPU and CUDA tensors: no
# dispatch mode, subclass, functionalization or tracing. A call with one of them and nothing
# for autograd to record runs the op's kernel straight from its autograd kernel, not through
# a redispatch: an op call 10.1 against 13.4 us (a stubbed launch, CPU tensors, this
# repository's CPU machine; under torch.inference_mode, which skips autograd, 6.4-7.0 us).
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView
_PLAIN_BELOW_AUTOGRAD = frozenset(
    torch._C.DispatchKeySet(key).raw_repr()
    for key in (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)
)


def _plain_below_autograd(keyset: Any) -> bool:
    below = (keyset & _AFTER_AUTOGRAD).remove(_AD_INPLACE_OR_VIEW)
    return below.raw_repr() in _PLAIN_BELOW_AUTOGRAD


def _direct_when_plain(general: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    """An autograd kernel that calls ``run`` itself where there is nothing to record and
    nothing between autograd and the backend kernel (``_plain_below_autograd``); else
    ``general``."""

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if _plain_below_autograd(keyset) and not (
            torch.is_grad_enabled() and torch._C._any_requires_grad(*args)
        ):
            return run(*args, **kwargs)
        return general(keyset, *args, **kwargs)

    return autograd_kernel


def _refuse_autograd(
    kernel: AttentionKernel, op_name: str, reason: str, run: Callable[..., Any]
) -> Callable[..., Any]:
    names = [t.name for t in kernel.tensors]

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            needs = [n for n, t in zip(names, args, strict=False) if t.requires_grad]
            raise no_backward_error(reason, needs)
        if _plain_below_autograd(keyset):
            return run(*args, **kwargs)
        # as PyTorch's own autograd kernels do (torch/_library/autograd.py): run the kernels
        # below autograd with the keys this call already has
        with torch._C._AutoDispatchBelowAutograd():
            below = keyset & torch._C._after_autograd_keyset
            return _REGISTERED[op_name].redispatch(below, *args, **kwargs)

    return autograd_kernel


def _register_backward(
    kernel: AttentionKernel, op_name: str, ops: BackwardOps, run: Callable[..., Any]
) -> None:
    count = inputs = len(kernel.tensors)
    params = len(kernel.params)
    bwd_name = f"{op_name}_bwd"
    args = [f"Tensor t_{safe_name(t.name)}" for t in kernel.tensors]
    for p in kernel.params:
        args.append(f"{_scalar_type(p.type)}? p_{safe_name(p.name)}")
    # needs: which of ``ops.floats`` the caller wants a gradient of (the others come back
    # empty; side inputs without one let the sm_90a backward take the call)
    args += ["Tensor out", "Tensor lse", "Tensor grad_out", "Tensor grad_lse", "bool[] needs"]
    schema = f"({', '.join(args)}) -> Tensor[]"
    _LIBRARY.define(bwd_name + schema)  # type: ignore[no-untyped-call]
    _LIBRARY.impl(bwd_name, ops.run, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"attncc::{bwd_name}", ops.fake, lib=_LIBRARY)
    bwd = getattr(torch.ops.attncc, bwd_name).default
    names = [t.name for t in kernel.tensors]
    position = {name: names.index(name) for name in ops.floats}

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        out, lse = output
        if lse.numel() == 0 and out.numel() != 0:
            raise RuntimeError(
                f"attncc {kernel.name}: the backward needs the forward's log-sum-exp; "
                "call the kernel itself (it asks for it), not its op with return_lse=False"
            )
        ctx.save_for_backward(*inputs[:count], out, lse)
        ctx.params = inputs[count : count + params]

    def backward(ctx: Any, grad_out: Any, grad_lse: Any) -> tuple[Any, ...]:
        *tensors, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        needs = [bool(ctx.needs_input_grad[position[name]]) for name in ops.floats]
        grads = bwd(*tensors, *ctx.params, out, lse, grad_out, grad_lse, needs)
        result: list[Any] = [None] * (inputs + params + 1)
        for name, grad in zip(ops.floats, grads, strict=True):
            if ctx.needs_input_grad[position[name]]:
                result[position[name]] = grad
        return tuple(result)

    # torch.library.register_autograd's kernel (made as it makes it), behind the direct call
    # of plain calls; register_autograd itself where this torch has no such maker
    make = getattr(getattr(torch._library, "autograd", None), "make_autograd_impl", None)
    if make is None:
        torch.library.register_autograd(
            f"attncc::{op_name}", backward, setup_context=setup_context, lib=_LIBRARY
        )
        return
    info = torch._library.autograd.Info(backward, setup_context)
    general = make(getattr(torch.ops.attncc, op_name).default, info)
    autograd_kernel = _direct_when_plain(general, run)
    _LIBRARY.impl(op_name, autograd_kernel, "Autograd", with_keyset=True)  # type: ignore[no-untyped-call]


def register(
    kernel: AttentionKernel,
    key: str,
    run: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    fake: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    backward: BackwardOps | str,
) -> Any:
    """The op ``torch.ops.attncc.<name>_<key>``, registered once per process; ``backward``
    is the kernel's backward, or why it has none (calls requiring grad are refused)."""
    op_name = f"{safe_name(kernel.name)}_{key}"
    if op_name not in _REGISTERED:
        _LIBRARY.define(op_name + _schema(kernel))  # type: ignore[no-untyped-call]
        _LIBRARY.impl(op_name, run, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"attncc::{op_name}", fake, lib=_LIBRARY)
        if isinstance(backward, str):
            refusing = _refuse_autograd(kernel, op_name, backward, run)
            _LIBRARY.impl(op_name, refusing, "Autograd", with_keyset=True)  # type: ignore[no-untyped-call]
        else:
            _register_backward(kernel, op_name, backward, run)
        _REGISTERED[op_name] = getattr(torch.ops.attncc, op_name).default
    return _REGISTERED[op_name]
