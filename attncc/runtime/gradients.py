"""From the backward kernels' buffers to the inputs' gradients.

The buffers are indexed by batch program (every batch axis, query heads included) and by row
or key; each input's gradient is the sum of its buffer over the elements whose subscripts
(the operand's index expressions, evaluated with ``attncc.torch_eval``) read the same input
element: kv heads sum their query heads (GQA), an input that a batch axis does not subscript
sums over it. Where each subscript reads a loop index of its own (or one divided by a size,
GQA's), a ``Recipe`` does it with views, sums and a permutation, kept a call geometry;
otherwise ``index_put_`` with accumulation does it deterministically (sorted on CUDA,
sequential on the CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of
from attncc.torch_eval import evaluate

__all__ = ["Recipe", "Scatter"]


class Scatter:
    def __init__(
        self,
        kernel: ir.AttentionKernel,
        sizes: Mapping[str, int],
        params: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        floats: tuple[str, ...],
        reads: list[str],
    ) -> None:
        self.k, self.sizes, self.params, self.tensors = kernel, sizes, params, tensors
        self.floats = floats
        self.dims = {a.index: a.dim for a in kernel.axes}
        # how many operands (q, k, v, side inputs, sinks) each input's gradient sums
        self.contributions = {name: reads.count(name) for name in floats}

    def whole(
        self, operand: ir.Operand, inner: tuple[str, ...], kernel_groups: bool = False
    ) -> bool:
        """Whether ``operand``'s buffer ([batch programs, *inner]) is its tensor's whole
        gradient as it stands, a permutation away: the only read of the tensor, each
        subscript a loop index of its own, none summed over or grouped; with
        ``kernel_groups`` the buffer's groups summed by the kernel (``recipe``'s)."""
        if self.contributions.get(operand.tensor) != 1:
            return False
        if kernel_groups:
            recipe = self.recipe(operand, inner, kernel_groups=True)
            return recipe is not None and not recipe.lacking
        frame = [a.index for a in self.k.batch_axes] + list(inner)
        names = [sub.name if isinstance(sub, ir.Index) else None for sub in operand.indices]
        return len(names) == len(frame) and set(names) == set(frame)

    def add(
        self,
        grads: dict[str, torch.Tensor],
        operand: ir.Operand,
        buffer: torch.Tensor,
        inner: tuple[str, ...],
        kernel_groups: bool = False,
    ) -> None:
        """Add ``buffer`` ([batch programs, *inner]; with ``kernel_groups`` its groups
        already summed, ``recipe``'s) into the gradient of ``operand``'s tensor, at the
        elements its subscripts read."""
        if operand.tensor not in self.floats:
            return
        frame = [a.index for a in self.k.batch_axes] + list(inner)
        shape = [self.sizes[self.dims[i]] for i in frame]
        recipe = self.recipe(operand, inner, kernel_groups)
        assert recipe is not None or not kernel_groups, "a kernel summed groups it has none of"
        if recipe is not None:
            # each subscript a loop index of its own (q[b, h, m, d], slopes[h]): the buffer
            # regrouped, summed and permuted (Recipe). The general scatter below builds an
            # index tensor per subscript and runs a sort-based index_put_: 47 ms of a 48 ms
            # backward at B=4 H=16 S=4k D=128 (H200)
            gradient = recipe(buffer)
            if operand.tensor in grads:
                grads[operand.tensor] = grads[operand.tensor] + gradient
            else:
                grads[operand.tensor] = gradient
            return
        values = buffer.reshape(shape)
        grid = {}
        for axis, index in enumerate(frame):
            view = [1] * len(frame)
            view[axis] = shape[axis]
            grid[index] = torch.arange(shape[axis], device=buffer.device).reshape(view)
        where = [
            torch.as_tensor(
                evaluate(sub, grid, self.sizes, self.params, self.tensors), device=buffer.device
            )
            for sub in operand.indices
        ]
        where = list(torch.broadcast_tensors(*where, values))[:-1]  # type: ignore[no-untyped-call]
        target = self.tensors[operand.tensor]
        base = grads.get(operand.tensor)
        if base is None:
            base = torch.zeros(target.shape, dtype=torch.float32, device=buffer.device)
        else:  # a copy: the sum so far may be a view of a kernel's buffer
            base = base.to(torch.float32, copy=True)
        grads[operand.tensor] = base.index_put_(tuple(where), values, accumulate=True)

    def recipe(
        self, operand: ir.Operand, inner: tuple[str, ...], kernel_groups: bool = False
    ) -> Recipe | None:
        """How ``operand``'s buffer ([batch programs, *inner]) becomes its tensor's gradient
        where each subscript reads a loop index of its own, or one divided by a size (GQA's
        k[b, h / G, n, d]); None where the general scatter is needed. With
        ``kernel_groups`` the buffer holds each group's sum ([b, h / G, n, d]: the sm_90a
        backward walking a group's heads)."""
        frame = [a.index for a in self.k.batch_axes] + list(inner)
        shape = tuple(self.sizes[self.dims[i]] for i in frame)
        groups = self._groups(shape, frame, operand)
        names = [g[0] for g in groups]
        if any(n is None for n in names) or len(set(names)) != len(names):
            return None
        splits = []  # (axis, group) of each grouped axis, in frame order
        for name, group in groups:
            if group > 1:
                splits.append((frame.index(str(name)), group))
        lacking = tuple(axis for axis, i in enumerate(frame) if i not in names)
        kept = [i for i in frame if i in names]
        permutation = tuple(kept.index(str(n)) for n in names)
        if kernel_groups:
            summed = list(shape)
            for axis, group in splits:
                summed[axis] //= group
            return Recipe(tuple(summed), (), lacking, permutation)
        return Recipe(shape, tuple(sorted(splits)), lacking, permutation)

    def kv_group(
        self, key: tuple[ir.Operand, tuple[str, ...]], value: tuple[ir.Operand, tuple[str, ...]]
    ) -> int:
        """The query heads a kv head serves where K and V read the innermost batch axis
        divided by the same group, and every other subscript a loop index of its own
        (GQA's k[b, h / G, n, d]: consecutive programs share K and V); else 1."""
        last = len(self.k.batch_axes) - 1
        groups = set()
        for operand, inner in (key, value):
            recipe = self.recipe(operand, inner)
            if recipe is None or len(recipe.splits) != 1 or recipe.splits[0][0] != last:
                return 1
            groups.add(recipe.splits[0][1])
        return groups.pop() if len(groups) == 1 else 1

    def _groups(
        self, shape: tuple[int, ...], frame: list[str], operand: ir.Operand
    ) -> list[tuple[str | None, int]]:
        """For each subscript of ``operand``: the loop index it reads plainly (group 1) or
        divided by a size that divides the index's extent (GQA's k[b, h / G, n, d]: the
        group G), or (None, 1) where it reads anything else."""
        groups: list[tuple[str | None, int]] = []
        for sub in operand.indices:
            if isinstance(sub, ir.Index):
                groups.append((sub.name, 1))
                continue
            grouped = (
                isinstance(sub, ir.BinOp)
                and sub.op == "/"
                and isinstance(sub.left, ir.Index)
                and sub.left.name in frame
                and not indices_of(sub.right)
            )
            if not grouped:
                groups.append((None, 1))
                continue
            assert isinstance(sub, ir.BinOp) and isinstance(sub.left, ir.Index)
            group = int(evaluate(sub.right, {}, self.sizes, self.params, self.tensors))
            size = shape[frame.index(sub.left.name)]
            if group <= 0 or size % group:
                groups.append((None, 1))
            else:
                groups.append((sub.left.name, group))
        return groups


class Recipe:
    """A buffer's way to its input's gradient (``Scatter.recipe``): viewed as ``shape``
    ([batch programs, *inner] by loop index), each grouped axis (``splits``: axis, group)
    summed over its groups, the axes the input lacks summed away, the rest permuted into
    the input's order. Kept a call geometry, so a repeated backward rebuilds nothing."""

    def __init__(
        self,
        shape: tuple[int, ...],
        splits: tuple[tuple[int, int], ...],
        lacking: tuple[int, ...],
        permutation: tuple[int, ...],
    ) -> None:
        self.shape, self.splits, self.lacking = shape, splits, lacking
        self.permutation = permutation
        self.identity = permutation == tuple(range(len(permutation)))

    def __call__(self, buffer: torch.Tensor) -> torch.Tensor:
        values = buffer.reshape(self.shape)
        for axis, group in reversed(self.splits):  # the last first: earlier axes stay put
            size = values.shape[axis]
            split = (*values.shape[:axis], size // group, group, *values.shape[axis + 1 :])
            values = values.reshape(split).sum(axis + 1)
        if self.lacking:
            values = values.sum(dim=self.lacking)
        return values if self.identity else values.permute(self.permutation)
