"""gqa-mapping: recognise grouped-query heads in the key/value subscripts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from attncc.ir import nodes as ir


@dataclass(frozen=True)
class GqaMapping:
    """Before: key and value are indexed by arbitrary batch expressions.
    After: ``group`` is set when a key subscript is ``h / (H / KVH)`` for a batch axis h over
    dim H and the key's dim there is KVH, so the runtime can check H % KVH == 0 with a clear
    message and later passes can give one program a whole group of query heads.
    """

    name: str = "gqa-mapping"

    def run(self, kernel: ir.AttentionKernel) -> ir.AttentionKernel:
        key_dims = kernel.tensor(kernel.key.tensor).dims
        for sub, kv_dim in zip(kernel.key.indices, key_dims, strict=True):
            match sub:
                case ir.BinOp(
                    op="/",
                    left=ir.Index(name=head),
                    right=ir.BinOp(op="/", left=ir.Dim(name=heads), right=ir.Dim(name=kv_heads)),
                ) if kv_heads == kv_dim:
                    axis = next((a for a in kernel.batch_axes if a.index == head), None)
                    if axis is not None and axis.dim == heads:
                        return replace(kernel, group=ir.GroupMapping(axis, kv_dim))
                case _:
                    pass
        return kernel
