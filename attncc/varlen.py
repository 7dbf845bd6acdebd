"""``attncc.varlen``: any prefill spec on flash-attn's packed variable-length layout.

flash-attn's varlen calls pack a batch of sequences of different lengths into
``q[total_q, H, D]``, ``k``/``v[total_k, KVH, D]`` with ``cu_seqlens_q``/``cu_seqlens_k``
(``[B + 1]`` int32 offsets). ``varlen(spec)`` derives a second spec from a batched prefill
spec and compiles it: the sequence-batch axis ``b`` goes, the query and key axes run over
the packed tokens, and each query's sequence (an id per query token, ``seq_q``) bounds its
keys to that sequence's slots, ``cu_seqlens_k[seq_q[m]] <= n < cu_seqlens_k[seq_q[m] + 1]``:
masks of the key index against a row value, so the tile index scans and lists only the key
tiles of a query tile's own sequences, reading no key's id. Every expression of the user's
spec (masks, score modifications, the softmax's sink) sees *local* values: ``m`` is the
query's position within its sequence, ``n`` the key's, ``b`` the sequence, ``M`` and ``N``
the query's sequence lengths. So ``mask m >= n`` is causal within each sequence and
``mask m + N - M >= n`` bottom-right causal within each.

Decode against a cache (flash-attn's ``seqused_k``): ``k``/``v`` hold each sequence's cache
slots (``cu_seqlens_k`` their offsets), of which only the first ``seqused_k[b]`` are written.
A call passing ``seqused_k`` runs a third spec, derived with ``seqused_k=True``: ``N`` is then
``seqused_k[b]`` and a query's keys end at ``cu_seqlens_k[b] + seqused_k[b]`` (so the tile
index skips the key tiles of unused slots as it skips other sequences' tiles), and
``mask m + N - M >= n`` puts the last query of a sequence on its last used key.

A key's local position reads its sequence's start through the query's sequence
(``n - cu_seqlens_k[seq_q[m]]``: the key's own, as the key lies in the query's sequence's
slots). With one packing (a call passing the same ``cu_seqlens`` tensor for queries and
keys, as prefill does) a fourth spec, derived with ``same_packing=True``, reads one offset
table for both, so ``mask m >= n`` in local positions is ``m - cu_seqlens_q[seq_q[m]] >=
n - cu_seqlens_q[seq_q[m]]``, whose table terms cancel: the key interval ``n <= m``, and
the kernel skips the tiles above each sequence's diagonal and runs those below it without a
mask, as the document-mask kernel does. With two tables it becomes ``m -
cu_seqlens_q[seq_q[m]] + cu_seqlens_k[seq_q[m]] >= n``: the row's diagonal in packed keys
against the key index, which the tile index bounds per tile as tightly.

The document-mask kernel on the same data compares a document id per key too
(``doc[m] == doc[n]``): its index builder reads the ids of every key tile up to each query
tile's diagonal, and its partial tiles load a tile of them. varlen reads no key's sequence.

The derived spec is spec text, checked and compiled like any other
(``VarlenKernel.source`` shows it); the rewrite works on the AST and prints every
expression fully parenthesised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attncc.codegen import sequence_ids as sequence_ids_source
from attncc.ir import lower
from attncc.ir import nodes as ir
from attncc.runtime.jit import interpreter, load_module, module_path
from attncc.spec import CheckedSpec, ast, load
from attncc.spec.check import walk

__all__ = ["VarlenKernel", "sequence_ids", "varlen", "varlen_source"]

# names the derived spec adds; a spec already using one of them is refused
_TOTAL_Q, _TOTAL_K, _OFFSETS = "TOTAL_Q", "TOTAL_K", "SEQS_PLUS_1"
_SEQ_Q, _CU_Q, _CU_K = "seq_q", "cu_seqlens_q", "cu_seqlens_k"
_ADDED = (_TOTAL_Q, _TOTAL_K, _OFFSETS, _SEQ_Q, _CU_Q, _CU_K)
# and, with seqused_k, the number of sequences and the used cache length of each
_SEQS, _USED_K = "SEQS", "seqused_k"


def _fmt(expr: ast.Expr) -> str:
    """Spec text for ``expr``, every compound term parenthesised (precedence-proof)."""
    match expr:
        case ast.Number(value=value):
            return repr(value)
        case ast.Name(name=name):
            return name
        case ast.Access(tensor=tensor, indices=indices):
            return f"{tensor.name}[{', '.join(_fmt(i) for i in indices)}]"
        case ast.Call(func=func, args=args):
            return f"{func.name}({', '.join(_fmt(a) for a in args)})"
        case ast.Neg(operand=x):
            return f"(-{_fmt(x)})"
        case ast.Not(operand=x):
            return f"(not {_fmt(x)})"
        case ast.Binary(op=op, left=a, right=b) | ast.Compare(op=op, left=a, right=b):
            return f"({_fmt(a)} {op} {_fmt(b)})"
        case ast.Logical(op=op, left=a, right=b):
            return f"({_fmt(a)} {op} {_fmt(b)})"
    raise AssertionError(expr)


@dataclass(frozen=True)
class _Rewrite:
    checked: CheckedSpec
    batch: str  # the sequence index (b) and its dim
    batch_dim: str
    query: str  # m, M
    query_dim: str
    key: str  # n, N
    key_dim: str
    # input name -> (position of the dropped batch axis, position of the token axis)
    operands: dict[str, tuple[int, int]]
    seqused_k: bool = False  # the key length is seqused_k[b], not the packed length
    same_packing: bool = False  # keys packed as the queries: one offset table

    @property
    def key_offsets(self) -> str:
        """The offset table of the keys."""
        return _CU_Q if self.same_packing else _CU_K

    @property
    def row_sequence(self) -> str:
        """The sequence of the query row, which is also its keys' (they lie in its slots)."""
        return f"{_SEQ_Q}[{self.query}]"

    def local(self, name: str) -> str | None:
        """The local value a name stands for in the user's expressions."""
        row_seq = self.row_sequence
        cu_k = self.key_offsets
        # the key's start through the query's sequence, whose slots hold the key: a
        # comparison of local positions then separates into a row side and the packed key
        # index (in one packing its table terms cancel: n <= m for causal)
        key_start = f"{cu_k}[{row_seq}]"
        key_length = (
            f"{_USED_K}[{row_seq}]"
            if self.seqused_k
            else f"({cu_k}[{row_seq} + 1] - {cu_k}[{row_seq}])"
        )
        return {
            self.query: f"({self.query} - {_CU_Q}[{row_seq}])",
            self.key: f"({self.key} - {key_start})",
            self.batch: row_seq,
            # lengths through the query's sequence: equal to the key's where the
            # sequence mask holds, and it keeps key-side terms reading the key only
            self.query_dim: f"({_CU_Q}[{row_seq} + 1] - {_CU_Q}[{row_seq}])",
            self.key_dim: key_length,
            self.batch_dim: f"({_OFFSETS} - 1)",
        }.get(name)

    def order(self, tensor: str) -> list[int] | None:
        """New subscript order of a computed tensor: the batch index dropped, the query
        index first (the output becomes ``[total_q, ...]``)."""
        if tensor in self.checked.inputs:
            return None
        indices = self.checked.defined_indices(tensor)
        kept = [i for i, name in enumerate(indices) if name != self.batch]
        first = [i for i in kept if indices[i] == self.query]
        return first + [i for i in kept if i not in first]

    def expr(self, node: ast.Expr) -> str:
        match node:
            case ast.Name(name=name):
                return self.local(name) or name
            case ast.Access(tensor=tensor, indices=indices):
                if tensor.name in self.operands:
                    dropped, token = self.operands[tensor.name]
                    subs = [_fmt(indices[token])] + [
                        _fmt(s) for i, s in enumerate(indices) if i not in (dropped, token)
                    ]
                    return f"{tensor.name}[{', '.join(subs)}]"
                order = self.order(tensor.name)
                if order is not None:
                    return f"{tensor.name}[{', '.join(_fmt(indices[i]) for i in order)}]"
                return f"{tensor.name}[{', '.join(self.expr(i) for i in indices)}]"
            case ast.Call(func=func, args=args):
                if func.name == "softmax":
                    # softmax(s, n[, sink]): the scores and axis stay as written
                    rest = [self.expr(a) for a in args[2:]]
                    return f"softmax({', '.join([_fmt(args[0]), _fmt(args[1]), *rest])})"
                return f"{func.name}({', '.join(self.expr(a) for a in args)})"
            case ast.Neg(operand=x):
                return f"(-{self.expr(x)})"
            case ast.Not(operand=x):
                return f"(not {self.expr(x)})"
            case (
                ast.Binary(op=op, left=a, right=b)
                | ast.Compare(op=op, left=a, right=b)
                | ast.Logical(op=op, left=a, right=b)
            ):
                return f"({self.expr(a)} {op} {self.expr(b)})"
            case ast.Number():
                return _fmt(node)
        raise AssertionError(node)


def _refuse(spec: CheckedSpec, why: str) -> ValueError:
    return ValueError(f"attncc.varlen({spec.name}): {why}")


def varlen_source(
    spec: str | Path | CheckedSpec,
    batch: str | None = None,
    seqused_k: bool = False,
    same_packing: bool = False,
) -> str:
    """The spec text of ``spec``'s variable-length form (see the module docstring).

    ``batch`` names the sequence-batch index (default: the first score index that indexes
    query, key, value and output directly, ``b`` in ``s[b, h, m, n]``). ``seqused_k``: the
    form that takes ``seqused_k[B]`` (int32), the used length of each sequence's keys.
    ``same_packing``: the form for keys packed as the queries, which takes ``seq_q`` and
    ``cu_seqlens_q`` only (and a key length of ``TOTAL_Q``)."""
    if seqused_k and same_packing:
        raise ValueError("varlen_source: seqused_k keys have a packing of their own")
    checked = load(spec)
    kernel = lower(checked)
    if kernel.query_axis is None:
        raise _refuse(checked, "the spec has no query axis; varlen takes prefill specs")
    if checked.views or checked.derived_dims:
        raise _refuse(checked, "views and derived dims (paged caches) have no packed form")
    taken = set(checked.dims) | set(checked.inputs) | set(checked.params) | set(checked.lets)
    clash = sorted(taken & {*_ADDED, *((_SEQS, _USED_K) if seqused_k else ())})
    if clash:
        raise _refuse(checked, f"the spec already names {', '.join(clash)}; rename it")

    def plain(operand: ir.Operand) -> set[str]:
        return {i.name for i in operand.indices if isinstance(i, ir.Index)}

    candidates = [
        a
        for a in kernel.batch_axes
        if all(a.index in plain(op) for op in (kernel.query, kernel.key, kernel.value))
        and a.index in kernel.output.indices
    ]
    if batch is not None:
        candidates = [a for a in candidates if a.index == batch]
    if not candidates:
        raise _refuse(
            checked,
            f"no sequence-batch index{f' {batch!r}' if batch else ''} subscripts query, key, "
            "value and output directly",
        )
    seq = candidates[0]
    query, key = kernel.query_axis, kernel.key_axis
    operands: dict[str, tuple[int, int]] = {}
    for op, token in ((kernel.query, query), (kernel.key, key), (kernel.value, key)):
        names = [i.name if isinstance(i, ir.Index) else None for i in op.indices]
        operands[op.tensor] = (names.index(seq.index), names.index(token.index))
    rw = _Rewrite(
        checked,
        seq.index,
        seq.dim,
        query.index,
        query.dim,
        key.index,
        key.dim,
        operands,
        seqused_k,
        same_packing,
    )
    seq_names = {seq.index, query.index, key.index, seq.dim, query.dim, key.dim}
    for name, value in checked.lets.items():
        used = {n.name for n in walk(value) if isinstance(n, ast.Name)} & seq_names
        if used:
            raise _refuse(checked, f"let {name} reads {', '.join(sorted(used))}")
    for info in checked.params.values():
        if info.default is not None:
            used = {n.name for n in walk(info.default) if isinstance(n, ast.Name)}
            if used & {query.dim, key.dim}:
                raise _refuse(checked, f"the default of param {info.name} reads a sequence length")

    lines = [f"attention {checked.name}_varlen"]
    dims = [d for d in checked.dims if d not in (seq.dim, query.dim, key.dim)]
    aux_dims = {d for t in checked.inputs.values() if t.name not in operands for d in t.dims}
    if {query.dim, key.dim} & aux_dims:
        raise _refuse(
            checked,
            "an input other than query, key and value has a query or key length axis; "
            "packed sequences have no per-sequence tensor of that shape",
        )
    if seq.dim in aux_dims:
        dims.append(seq.dim)
    total_k = _TOTAL_Q if same_packing else _TOTAL_K
    added_dims = [
        _TOTAL_Q,
        *(() if same_packing else (_TOTAL_K,)),
        _OFFSETS,
        *((_SEQS,) if seqused_k else ()),
    ]
    lines.append(f"dims {', '.join([*dims, *added_dims])}")
    for tensor in checked.inputs.values():
        dtype = f": {tensor.dtype}" if tensor.dtype != "float" else ""
        layout = list(tensor.dims)
        if tensor.name in operands:
            dropped, at = operands[tensor.name]
            total = _TOTAL_Q if tensor.name == kernel.query.tensor else total_k
            layout = [total] + [d for i, d in enumerate(tensor.dims) if i not in (dropped, at)]
        lines.append(f"in {tensor.name}[{', '.join(layout)}]{dtype}")
    lines.append(f"in {_SEQ_Q}[{_TOTAL_Q}]: i32")
    lines.append(f"in {_CU_Q}[{_OFFSETS}]: i32")
    if not same_packing:
        lines.append(f"in {_CU_K}[{_OFFSETS}]: i32")
    if seqused_k:
        lines.append(f"in {_USED_K}[{_SEQS}]: i32")
    for info in checked.params.values():
        default = f" = {rw.expr(info.default)}" if info.default is not None else ""
        lines.append(f"param {info.name}: {info.dtype}{default}")
    for name, value in checked.lets.items():
        lines.append(f"let {name} = {_fmt(value)}")
    # the keys of the query's sequence first: its slots, [start, start + used) with
    # seqused_k; the tile index scans only the key tiles of a query tile's sequences
    row_seq, cu_k = rw.row_sequence, rw.key_offsets
    lines.append(f"mask {key.index} >= {cu_k}[{row_seq}]")
    if seqused_k:
        lines.append(f"mask {key.index} < ({cu_k}[{row_seq}] + {_USED_K}[{row_seq}])")
    else:
        lines.append(f"mask {key.index} < {cu_k}[({row_seq} + 1)]")
    for stmt in checked.spec.statements:
        match stmt:
            case ast.AssignStmt(target=target, indices=indices, value=value):
                lhs = target.name
                if indices is not None:
                    own = tuple(i.name for i in indices)
                    kept = [i for i in own if i != seq.index]
                    kept = [i for i in kept if i == query.index] + [
                        i for i in kept if i != query.index
                    ]
                    lhs = f"{target.name}[{', '.join(kept)}]"
                lines.append(f"{lhs} = {rw.expr(value)}")
            case ast.MaskStmt(condition=condition):
                lines.append(f"mask {rw.expr(condition)}")
            case ast.OutStmt(name=out_name):
                lines.append(f"out {out_name.name}")
            case ast.ScheduleStmt(name=schedule_name):
                lines.append(f"schedule {schedule_name.name}")
            case _:
                pass
    return "\n".join(lines) + "\n"


class VarlenKernel:
    """``kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **inputs)``
    on flash-attn's packed layout: ``q[total_q, H, D]``, ``k``/``v[total_k, KVH, D]``,
    ``cu_seqlens_*`` int32 ``[B + 1]`` offsets from 0 to the totals. Other inputs and params
    by name, ``return_lse=True`` as for any kernel (the lse is ``[H, total_q]``, as
    flash-attn's). The maximum lengths are accepted for flash-attn's signature, not needed.

    ``seqused_k=`` (int32 ``[B]``): only the first ``seqused_k[b]`` keys of sequence ``b``'s
    slots are used; that call runs the spec of ``seqused_source``, derived and compiled on
    first use (``derive_seqused`` writes it).

    A call whose ``cu_seqlens_k`` is ``cu_seqlens_q`` (the same tensor, or a view of the
    same memory with the same shape and strides: no values are compared, which would cost
    a device synchronisation) runs the spec of ``same_packing_source`` (``derive_same``
    writes it, on first use), which skips the tiles above each sequence's causal diagonal."""

    def __init__(
        self,
        source: str,
        compile_spec: Callable[[str], Any],
        derive_seqused: Callable[[], str] | None = None,
        derive_same: Callable[[], str] | None = None,
    ) -> None:
        self.source = source
        self._compile = compile_spec
        self._derive_seqused = derive_seqused
        self._derive_same = derive_same
        self.kernel = compile_spec(source)
        self._seqused_kernel: Any = None
        self._same_kernel: Any = None

    @property
    def seqused_source(self) -> str:
        """The spec text of the seqused_k form."""
        if self._derive_seqused is None:
            raise ValueError(
                f"attncc.varlen({self.kernel.name}): built without a seqused_k form; "
                "build it with attncc.varlen(spec)"
            )
        return self._derive_seqused()

    @property
    def seqused_kernel(self) -> Any:
        """The compiled seqused_k form (compiled on first use)."""
        if self._seqused_kernel is None:
            self._seqused_kernel = self._compile(self.seqused_source)
        return self._seqused_kernel

    @property
    def same_packing_source(self) -> str | None:
        """The spec text of the one-packing form (None: built without one, and calls with
        one packing run ``source``)."""
        return None if self._derive_same is None else self._derive_same()

    @property
    def same_packing_kernel(self) -> Any:
        """The compiled one-packing form (compiled on first use), or None."""
        if self._same_kernel is None and self._derive_same is not None:
            self._same_kernel = self._compile(self._derive_same())
        return self._same_kernel

    def kernel_for(
        self,
        total_q: int,
        total_k: int,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        seqused_k: torch.Tensor | None = None,
    ) -> Any:
        """The compiled form a call with these packed lengths and tables runs: the seqused_k
        form, the one-packing form (one offset table for queries and keys, by identity of
        memory, never by value), or ``kernel``."""
        if seqused_k is not None:
            return self.seqused_kernel
        if (
            self._derive_same is not None
            and total_q == total_k
            and _one_table(cu_seqlens_q, cu_seqlens_k)
        ):
            return self.same_packing_kernel
        return self.kernel

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
        *,
        seqused_k: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        for name, cu, total in (
            (_CU_Q, cu_seqlens_q, q.shape[0]),
            (_CU_K, cu_seqlens_k, k.shape[0]),
        ):
            if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32:
                raise TypeError(f"{name} must be a 1-D int32 tensor of B + 1 offsets")
            if cu.device.type == "cpu" and (
                int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any())
            ):
                raise ValueError(
                    f"{name} must rise from 0 to the packed length {total}, got {cu.tolist()}"
                )
        if cu_seqlens_q.device != q.device or cu_seqlens_k.device != q.device:
            raise ValueError(
                f"cu_seqlens_q and cu_seqlens_k must be on the queries' device {q.device}, "
                f"got {cu_seqlens_q.device} and {cu_seqlens_k.device}"
            )
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise ValueError(
                f"cu_seqlens_q and cu_seqlens_k must have one length (B + 1), got "
                f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
            )
        kernel = self.kernel_for(q.shape[0], k.shape[0], cu_seqlens_q, cu_seqlens_k, seqused_k)
        one_packing = kernel is self._same_kernel
        if seqused_k is not None:
            _check_seqused_k(seqused_k, cu_seqlens_k)
        keys = None if one_packing else (cu_seqlens_k, k.shape[0])
        # traced by torch.compile, PyTorch's own operations: a graph of them, no Triton
        # kernel of attncc's own to wrap
        on_device = cu_seqlens_q.is_cuda and not torch.compiler.is_compiling()
        seq_q = sequence_ids(cu_seqlens_q, q.shape[0], keys, seqused_k, on_device)
        tables = {_SEQ_Q: seq_q, _CU_Q: cu_seqlens_q}
        if seqused_k is not None:
            tables[_USED_K] = seqused_k
        if keys is not None:  # the two-table forms read the keys' own offsets
            tables[_CU_K] = cu_seqlens_k
        result = kernel(q, k, v, **tables, **kwargs)
        if not kwargs.get("return_lse"):
            return result
        out, lse = result
        # the kernel returns the lse in its scores' index order ([total_q, H] for s[m, h, n]);
        # flash-attn's varlen calls return [H, total_q]: the query axis last
        order = kernel.ir.lse_order
        query = kernel.ir.query_axis.index
        last = [order.index(i) for i in order if i != query] + [order.index(query)]
        return out, lse.permute(last)


def _check_seqused_k(seqused_k: torch.Tensor, cu_seqlens_k: torch.Tensor) -> None:
    """seqused_k is int32 [B], each within its sequence's slots (0 <= used <= slots)."""
    batch = cu_seqlens_k.shape[0] - 1
    if (
        not isinstance(seqused_k, torch.Tensor)
        or seqused_k.dim() != 1
        or seqused_k.dtype != torch.int32
        or seqused_k.shape[0] != batch
    ):
        got = (
            f"{str(seqused_k.dtype).removeprefix('torch.')} {list(seqused_k.shape)}"
            if isinstance(seqused_k, torch.Tensor)
            else type(seqused_k).__name__
        )
        raise TypeError(f"seqused_k must be a 1-D int32 tensor of {batch} lengths, got {got}")
    if seqused_k.device != cu_seqlens_k.device:
        raise ValueError(
            f"seqused_k is on {seqused_k.device}, cu_seqlens_k on {cu_seqlens_k.device}"
        )
    if seqused_k.device.type == "cpu":  # on the GPU, sequence_ids checks them
        slots = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        if bool(((seqused_k < 0) | (seqused_k > slots)).any()):
            raise ValueError(
                f"seqused_k must lie within each sequence's key slots {slots.tolist()}, "
                f"got {seqused_k.tolist()}"
            )


def _one_table(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are one offset table: the same memory, shape and strides."""
    return a is b or (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def sequence_ids(
    cu_seqlens_q: torch.Tensor,
    total_q: int,
    keys: tuple[torch.Tensor, int] | None = None,
    seqused_k: torch.Tensor | None = None,
    on_device: bool = False,
) -> torch.Tensor:
    """The sequence of each packed query token (int32 ``[total_q]``), no host
    synchronisation. ``keys`` (``cu_seqlens_k``, ``total_k``): the keys' own table, checked
    with ``seqused_k`` (the kernels bound each query's keys by it and read no key's id).

    ``on_device``: one launch of ``sequence_ids_kernel`` (templates/triton/
    sequence_ids.py.jinja; on CPU tensors, in Triton's interpreter), which also checks the
    tables and ``seqused_k`` on the device, stopping with a device-side assertion where one
    is broken. Otherwise ``torch.searchsorted`` (the caller has checked CPU tables)."""
    if not on_device:
        if cu_seqlens_q.is_cuda:  # the kernel's checks, as PyTorch's device-side assertions
            _assert_tables(cu_seqlens_q, total_q, keys, seqused_k)
        return _searched_ids(cu_seqlens_q, total_q)
    device = cu_seqlens_q.device
    batch = cu_seqlens_q.shape[0] - 1
    seq_q = torch.empty(total_q, dtype=torch.int32, device=device)
    cu_k, total_k = keys if keys is not None else (cu_seqlens_q, 0)
    used = seqused_k if seqused_k is not None else cu_seqlens_q
    spread = max(total_q, batch, 1)
    interpreted = device.type == "cpu"
    module = load_module(_sequence_ids_path(), interpreted)
    on_gpu = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
    with interpreter(interpreted), on_gpu:
        module.sequence_ids_kernel[(-(-spread // _IDS_BLOCK),)](
            cu_seqlens_q.contiguous(),
            seq_q,
            total_q,
            cu_k.contiguous(),
            total_k,
            used.contiguous(),
            batch,
            BLOCK=_IDS_BLOCK,
            CHUNK=_IDS_CHUNK,
            KEY_TABLE=keys is not None,
            USED=seqused_k is not None,
        )
    return seq_q


# tokens per program of sequence_ids_kernel, and sequence ends it compares them with at once
_IDS_BLOCK, _IDS_CHUNK = 128, 128


@functools.cache
def _sequence_ids_path() -> Path:
    return module_path("sequence_ids", sequence_ids_source.render())


def _assert_tables(
    cu_seqlens_q: torch.Tensor,
    total_q: int,
    keys: tuple[torch.Tensor, int] | None,
    seqused_k: torch.Tensor | None,
) -> None:
    """sequence_ids_kernel's checks in PyTorch operations, asserted on the device."""
    for cu, total in (cu_seqlens_q, total_q), *((keys,) if keys is not None else ()):
        rising = (cu[1:] >= cu[:-1]).all()
        torch._assert_async(rising & (cu[0] == 0) & (cu[-1] == total))
    if seqused_k is not None and keys is not None:
        slots = keys[0][1:] - keys[0][:-1]
        torch._assert_async(((seqused_k >= 0) & (seqused_k <= slots)).all())


def _searched_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """The sequence of each packed token, by torch.searchsorted: the offsets at or below
    it, less one (offset 0). Searched in the whole table: inductor's searchsorted in the
    view ``cu_seqlens[1:]`` (torch 2.11, H200) read it from offset 0, ids one too high."""
    tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.int32)
    return torch.searchsorted(cu_seqlens, tokens, right=True, out_int32=True) - 1


def varlen(
    spec: Any, batch: str | None = None, target: str = "auto", **options: Any
) -> VarlenKernel:
    """A ``VarlenKernel`` for a prefill spec (text, path, checked spec, or a compiled
    ``Kernel``, whose spec it reuses): see the module docstring."""
    from attncc.api import compile as compile_spec
    from attncc.runtime.kernel import Kernel

    if isinstance(spec, Kernel):
        spec = spec.spec
    source = varlen_source(spec, batch)
    return VarlenKernel(
        source,
        lambda text: compile_spec(text, target, **options),
        lambda: varlen_source(spec, batch, seqused_k=True),
        lambda: varlen_source(spec, batch, same_packing=True),
    )
