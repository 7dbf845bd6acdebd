"""Triton backend: lower an optimised ``AttentionKernel`` to a render context, then render.

All decisions (names, offsets, bounds, score lines) are made here, once; the templates in
``templates/triton`` only place the prepared strings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import jinja2

from attncc.codegen import exprs as cx
from attncc.codegen import host, plan, templating
from attncc.ir import nodes as ir
from attncc.ir.verify import indices_of, subexprs
from attncc.passes.schedule import group_subscript
from attncc.spec import ast

TEMPLATE_DIR = templating.TEMPLATES / "triton"
LOG2E = plan.LOG2E


def environment() -> jinja2.Environment:
    return templating.environment("triton")


@dataclass(frozen=True)
class Rendered:
    source: str
    entry: str
    template: str


def _and(parts: list[str]) -> str | None:
    if not parts:
        return None
    return " & ".join(f"({p})" for p in parts)


def score_tile(mod: ir.Expr, text: str) -> str:
    """``text``, a rendering of score modification ``mod`` (or of a part of it), as a whole
    tile of scores: a modification that does not read the score (``s = 0.5``, ``s =
    bias[m]``) renders to a scalar or a row, which the softmax's row reductions and P V
    cannot take (the tile is qk's)."""
    if any(isinstance(e, ir.Score) for e in subexprs(mod)):
        return text
    return f"tl.full(qk.shape, 0.0, tl.float32) + ({text})"


def _value_range(values: str, expr: str, exact: bool, axis: int, lo: str, hi: str) -> list[str]:
    """Lines giving ``lo``/``hi``, the min and max of ``expr`` along ``axis`` (no padding:
    callers clamp padded rows and keys onto real ones, which leaves min and max unchanged).

    Integers compare as int64 (exact, whatever the ids); a float side makes both float32,
    as the per-element mask compares them. A NaN passes no comparison but ``!=``: it widens
    the range to everything, so its tile is never dead through ``!=`` nor ever full."""
    if exact:
        return [
            f"{values} = ({expr}).to(tl.int64)",
            f"{lo} = tl.reduce({values}, {axis}, _min_combine)",
            f"{hi} = tl.reduce({values}, {axis}, _max_combine)",
        ]
    number = f"{values} == {values}"
    return [
        f"{values} = ({expr}).to(tl.float32)",
        f'{lo} = tl.reduce(tl.where({number}, {values}, float("-inf")), {axis}, _min_combine)',
        f'{hi} = tl.reduce(tl.where({number}, {values}, float("inf")), {axis}, _max_combine)',
    ]


class _Context:
    def __init__(
        self, kernel: ir.AttentionKernel, spec: ast.Spec | str, tanh_approx: bool = True
    ) -> None:
        self.k = kernel
        self.source_text = spec if isinstance(spec, str) else spec.source
        self.spec_lines = plan.spec_lines(None if isinstance(spec, str) else spec)
        self.tensors = {t.name: t for t in kernel.tensors}
        self.query = kernel.query_axis.index if kernel.query_axis else None
        self.key = kernel.key_axis.index
        self.gathered = self.gathered_reads()
        # tanh's implementation follows the call's dtype (plan.TANH_APPROX_DTYPES; not in the
        # backward, ``tanh_approx``): every kernel has the output's pointer, whose element
        # type is that dtype at compile time
        approx = tanh_approx and "tanh" in plan.functions_used(kernel) and plan.TANH_APPROX_DTYPES
        self.float_type = (
            f"{cx.tensor_var(kernel.output.name)}.dtype.element_ty" if approx else None
        )

    def env(self, query_var: str | None = None, vector: bool = True) -> cx.TritonEnv:
        indices = {a.index: cx.index_var(a.index) for a in self.k.batch_axes}
        indices[self.key] = cx.index_var(self.key)
        if self.query:
            indices[self.query] = query_var or cx.index_var(self.query)
        vector_indices = {self.key} | ({self.query} if self.query and vector else set())
        return cx.TritonEnv(
            indices, self.tensors, frozenset(vector_indices), float_type=self.float_type
        )

    def operand(self, operand: ir.Operand, row: str | None, col: str) -> dict[str, str]:
        """Scalar base offset plus the strides along the row and the column index."""
        base: list[str] = []
        row_stride, col_stride = "0", "0"
        env = self.env()
        for part in plan.operand_parts(operand, row, col):
            stride = cx.stride_var(operand.tensor, part.axis)
            if part.kind == "row":
                row_stride = stride
            elif part.kind == "col":
                col_stride = stride
            else:
                base.append(f"({cx.triton_expr(part.sub, env)}) * {stride}")
        return {"base": " + ".join(base) or "0", "row": row_stride, "col": col_stride}

    def kv_operand(
        self,
        operand: ir.Operand,
        col: str,
        env: cx.TritonEnv,
        replaced: dict[ir.Expr, str] | None = None,
    ) -> dict[str, Any]:
        """Keys or values: a per-program base, the head-dim stride, and how a tile's keys
        offset it: ``start_n * stride`` for a plain key subscript, or a per-key gather when
        the key index goes through other tensors (a paged cache's page table).

        ``replaced`` maps whole subscripts to scalar variables (split-KV's kv head)."""
        base: list[str] = []
        linear, gather, col_stride = None, [], "0"
        # gathers see the tile's keys as a vector ``offs_n``; batch indices stay scalars;
        # tensor reads through the key (page-table entries) are loaded once per tile
        keys = cx.TritonEnv(
            {**env.indices, self.key: "offs_n"},
            self.tensors,
            frozenset({self.key}),
            named=self.gather_names(),
            float_type=self.float_type,
        )
        parts = plan.operand_parts(operand, None, col, self.key, replaced)
        for part in parts:
            stride = cx.stride_var(operand.tensor, part.axis)
            if part.kind == "key":
                linear = stride
            elif part.kind == "col":
                col_stride = stride
            elif part.kind == "replaced":
                base.append(f"{part.var} * {stride}")
            elif part.kind == "gather":
                gather.append(f"({cx.triton_expr(part.sub, keys)}) * {stride}")
            else:
                base.append(f"({cx.triton_expr(part.sub, env)}) * {stride}")
        if linear is not None and gather:
            gather.append(f"offs_n * {linear}")
            linear = None
        per_key = " + ".join(gather)
        tma = self.descriptor(operand, parts, env)
        return {
            **tma,
            # the axis a plain key subscript steps along (None: keys read through a gather)
            "key_axis": next((p.axis for p in parts if p.kind == "key"), None)
            if linear is not None
            else None,
            "base": " + ".join(base) or "0",
            "col": col_stride,
            # K tiles are [head dim, keys]; V tiles [keys, head dim]
            "k_init": f"offs_n0[None, :] * {linear}" if linear else "0",
            "v_init": f"offs_n0[:, None] * {linear}" if linear else "0",
            "k_tile": f"start_n * {linear}" if linear else f"({per_key})[None, :]",
            "v_tile": f"start_n * {linear}" if linear else f"({per_key})[:, None]",
            "k_keys": f"offs_n[None, :] * {linear}" if linear else f"({per_key})[None, :]",
            "v_keys": f"offs_n[:, None] * {linear}" if linear else f"({per_key})[:, None]",
        }

    def descriptor(
        self, operand: ir.Operand, parts: list[plan.Part], env: cx.TritonEnv
    ) -> dict[str, Any]:
        """Whether K or V tiles can be loaded through a TMA tensor descriptor, and how.

        Possible when the key subscript is the plain key index, the head dim is the last
        axis (contiguous at run time: the host checks strides and falls back to pointer
        loads) and no subscript reads through the key. The descriptor covers the whole
        tensor; a tile is the box [1, .., BLOCK_N (key axis), .., BLOCK_D (last axis)] at
        these coordinates, and out-of-range keys and head-dim columns arrive as zeros."""
        kinds = [part.kind for part in parts]
        if kinds.count("key") != 1 or kinds[-1] != "col" or "gather" in kinds or len(kinds) > 5:
            return {"tma": False, "coords": "", "box": ""}
        coords, box = [], []
        for part in parts:
            if part.kind == "key":
                coords.append("start_n")
                box.append("block_n")
            elif part.kind == "col":
                coords.append("0")
                box.append("block_d" if operand is self.k.key else "block_dv")
            else:
                value = part.var if part.kind == "replaced" else cx.triton_expr(part.sub, env)
                coords.append(f"({value}).to(tl.int32)")
                box.append("1")
        # the same tile through a key-major tensor (the key axis and the last one swapped)
        where = [p.kind for p in parts].index("key")
        coords_t, box_t = list(coords), list(box)
        coords_t[where], coords_t[-1] = coords[-1], coords[where]
        box_t[where], box_t[-1] = box[-1], box[where]
        return {
            "tma": True,
            "coords": ", ".join(coords),
            "box": ", ".join(box),
            "coords_key_major": ", ".join(coords_t),
            "box_key_major": ", ".join(box_t),
        }

    def gathered_reads(self) -> tuple[ir.Load, ...]:
        """Tensor reads in the key and value subscripts that depend on the key index (a paged
        cache's page-table entries), each once, innermost first: K and V of a tile share
        one load of each, named ``gather_<i>``."""
        found: list[ir.Load] = []
        for operand in (self.k.key, self.k.value):
            for sub in operand.indices:
                for e in reversed(list(subexprs(sub))):
                    if isinstance(e, ir.Load) and self.key in indices_of(e) and e not in found:
                        found.append(e)
        return tuple(found)

    def gather_names(self, prefix: str = "gather_") -> dict[ir.Expr, str]:
        return {e: f"{prefix}{i}" for i, e in enumerate(self.gathered)}

    def gather_lines(
        self, env: cx.TritonEnv, keys: str = "offs_n", prefix: str = "gather_"
    ) -> list[str]:
        """``<prefix>i = <load>`` for every gathered read of the keys ``keys``, innermost
        first, so each line only uses names defined before it."""
        key_env = replace(
            env,
            indices={**env.indices, self.key: keys},
            vector_indices=frozenset({self.key}),
            named={},
        )
        names = self.gather_names(prefix)
        lines = []
        for i, expr in enumerate(self.gathered):
            earlier: dict[ir.Expr, str] = {e: names[e] for e in self.gathered[:i]}
            load = cx.triton_expr(expr, replace(key_env, named=earlier))
            # int64: page index * page stride passes 2**31 elements in large page pools
            lines.append(f"{names[expr]} = ({load}).to(tl.int64)")
        return lines

    def page_tables(self, env: cx.TritonEnv) -> dict[str, Any] | None:
        """A split kernel's page tables: where every gathered read is a table read at the key
        divided by a dim (``page_table[b, n / PAGE]``; its other subscripts do not read the
        key), a program loads its chunk's entries once before its key loops (``PAGE_TABLE``
        of them, counted by the host: ``_page_table_entries``) and each tile takes its keys'
        entries from them (``tl.gather``), so no tile's K and V copies wait on a load of
        their addresses. ``lines`` load the tables (``start``: the chunk's first key),
        ``take`` names a tile's entries (``gather_i``), ``pages`` is the host's tuple of the
        page sizes.
        None where there is none or a gathered read has another form."""
        if not self.gathered:
            return None
        lines: list[str] = []
        take: list[str] = []
        pages: list[str] = []
        names = self.gather_names()
        for expr in self.gathered:
            assert isinstance(expr, ir.Load)
            keyed = [i for i, sub in enumerate(expr.indices) if self.key in indices_of(sub)]
            if len(keyed) != 1:
                return None
            page_of = expr.indices[keyed[0]]
            if not (
                cx.fast_division(page_of)
                and isinstance(page_of, ir.BinOp)
                and page_of.op == "/"
                and page_of.left == ir.Index(self.key)
            ):
                return None
            name = names[expr]
            first = name.replace("gather_", "table_first_")
            slots = name.replace("gather_", "table_slots_")
            table = name.replace("gather_", "table_")
            # the table read at every slot of the chunk's pages: the key index stands for the
            # slot, so the load is masked where a slot runs past the table, as a key's is
            by_slot = replace(
                expr,
                indices=tuple(
                    ir.Index(self.key) if i == keyed[0] else sub
                    for i, sub in enumerate(expr.indices)
                ),
            )
            slot_env = replace(
                env, indices={**env.indices, self.key: slots}, vector_indices=frozenset({self.key})
            )
            start_env = replace(
                env, indices={**env.indices, self.key: "start"}, vector_indices=frozenset()
            )
            tile_env = replace(
                env,
                indices={**env.indices, self.key: "offs_n"},
                vector_indices=frozenset({self.key}),
            )
            lines += [
                f"{first} = {cx.triton_expr(page_of, start_env)}",
                f"{slots} = {first} + tl.arange(0, PAGE_TABLE)",
                f"{table} = ({cx.triton_expr(by_slot, slot_env)}).to(tl.int64)",
            ]
            page = cx.triton_expr(page_of, tile_env)
            take.append(
                f"{name} = tl.gather({table}, tl.minimum({page} - {first}, PAGE_TABLE - 1), 0)"
            )
            pages.append(cx.host_expr(page_of.right, dims="sizes", params="params"))
        return {"lines": lines, "take": take, "pages": f"({', '.join(pages)},)"}

    def output(self) -> tuple[dict[str, str], dict[str, str]]:
        out = self.k.output
        base, row, col = [], "0", "0"
        for axis, index in enumerate(out.indices):
            stride = cx.stride_var(out.name, axis)
            if index == self.query:
                row = stride
            elif index == self.k.value_axis.index:
                col = stride
            else:
                base.append(f"{cx.index_var(index)} * {stride}")
        lse_base = [
            f"{cx.index_var(a.index)} * lse_stride_{i}" for i, a in enumerate(self.k.batch_axes)
        ]
        lse_row = f"lse_stride_{len(self.k.batch_axes)}" if self.query else "0"
        return (
            {"base": " + ".join(base) or "0", "row": row, "col": col},
            {"base": " + ".join(lse_base) or "0", "row": lse_row},
        )

    def bounds(self) -> dict[str, Any]:
        """The visible key range's expressions (lo, hi, full_lo, full_hi) and lower_bounded:
        whether a mask bounds the keys from below (else every row sees key 0)."""
        assert self.k.mask_plan is not None
        key_size = cx.dim_var(self.k.key_axis.dim)
        rows = {"first": "m_first", "last": "m_last"}
        limits = {"max": ("tl.maximum", "0"), "min": ("tl.minimum", key_size)}
        result: dict[str, Any] = {"lower_bounded": bool(self.k.mask_plan.lower)}
        for name, (bounds, combine) in plan.key_range(self.k.mask_plan).items():
            func, limit = limits[combine]
            parts = [cx.triton_expr(b.expr, self.env(rows[row], vector=False)) for b, row in bounds]
            # keys lie in [0, N): bounds from the masks are clamped into that range
            result[name] = templating.nested(func, [*parts, limit])
        return result

    def tile_index(self) -> dict[str, Any] | None:
        """Render context of the tile index builder (tile_index.py.jinja), or None."""
        index = self.k.tile_index
        if index is None:
            return None
        assert self.query is not None
        batch = {a.index: cx.index_var(a.index) for a in index.axes}
        # rows: a vector over the query tile; keys: [key tiles of a chunk, keys of a tile]
        rows = cx.TritonEnv(
            {**batch, self.query: "offs_m"},
            self.tensors,
            frozenset({self.query}),
            float_type=self.float_type,
        )
        keys = replace(
            rows, indices={**batch, self.key: "offs_n"}, vector_indices=frozenset({self.key})
        )
        row_lines: list[str] = []
        key_lines: list[str] = []
        narrow_lines: list[str] = []  # the scan's [lo, hi) from masks of the bare key index
        key_size = cx.dim_var(self.k.key_axis.dim)
        live = ["tile_ok", "(start_n < hi)", "(start_n + BLOCK_N > lo)"]
        full = ["live", "(start_n >= full_lo)", "(start_n + BLOCK_N <= full_hi)"]
        for i, sep in enumerate(index.masks):
            exact = sep.row.type != "float" and sep.key.type != "float"
            row_lo, row_hi, key_lo, key_hi = (
                f"{x}_{i}" for x in ("row_lo", "row_hi", "key_lo", "key_hi")
            )
            row_lines += _value_range(
                f"row_vals_{i}", cx.triton_expr(sep.row, rows), exact, 0, row_lo, row_hi
            )
            key_lines += _value_range(
                f"key_vals_{i}", cx.triton_expr(sep.key, keys), exact, 1, key_lo, key_hi
            )
            live.append(f"({plan.can_meet(sep.op, row_lo, row_hi, key_lo, key_hi)})")
            full.append(f"({plan.always(sep.op, row_lo, row_hi, key_lo, key_hi)})")
            if exact and sep.key == ir.Index(self.key):
                lower, upper = plan.key_index_range(sep.op, row_lo, row_hi)
                if lower is not None:
                    narrow_lines.append(
                        f"lo = tl.minimum(tl.maximum(lo, {lower}), {key_size}).to(tl.int32)"
                    )
                if upper is not None:
                    narrow_lines.append(f"hi = tl.maximum(tl.minimum(hi, {upper}), 0).to(tl.int32)")
        programs = plan.index_programs(index.axes)
        return {
            "build_fn": f"_attncc_{cx.safe_name(self.k.name)}_tile_index",
            "runtime_ints": self.runtime_ints(("KEY_TILES",)),
            "batch_lines": self.batch_lines(index.axes),
            "row_lines": row_lines,
            "key_lines": key_lines,
            "narrow_lines": narrow_lines,
            "live": " & ".join(live),
            # a residual mask that is not separable applies per element in every tile
            "full": " & ".join(full) if index.full else "live & (tiles < 0)",
            "program": programs.program,
            "programs": programs.count,
            "programs_host": programs.count_host,
            "key_size": key_size,
        }

    def loop(
        self,
        env: cx.TritonEnv,
        k_parts: dict[str, Any],
        v_parts: dict[str, Any],
        descriptors: bool = False,
        key_blocks: bool = False,
        page_tables: bool = False,
    ) -> dict[str, Any]:
        """The key loop's values (attend.py.jinja) for index variables as in ``env``;
        ``descriptors``: the kernel may load K and V tiles through TMA descriptors;
        ``page_tables``: the split kernel's loop, each of whose programs walks one chunk of
        keys: its page-table entries may be loaded once a chunk (``page_tables``);
        ``key_blocks``: the fused kernel's loop, whose tiles start at multiples of BLOCK_N:
        key blocks read once a tile (KEY_BLOCKS_ALIGNED), FP8 P·V (FP8_PV), and score
        factors of the rows hoisted before it (``score_lines``)."""
        mask_plan = self.k.mask_plan
        assert mask_plan is not None
        blocks = self.key_blocks() if key_blocks else {}
        env = replace(env, named={**env.named, **blocks})
        masks = [cx.triton_expr(m, env) for m in self.k.masks]
        residual = [cx.triton_expr(m, env) for m in mask_plan.residual]
        key_var = cx.index_var(self.key)
        block_lines = [
            f"{name} = (start_n // {cx.triton_expr(block.right, env)}) if KEY_BLOCKS_ALIGNED "
            f"else ({key_var} // {cx.triton_expr(block.right, env)})"
            for block, name in blocks.items()
            if isinstance(block, ir.BinOp)
        ]
        scale = self.k.value_scale
        fp8_pv = (
            self.k.fp8
            and key_blocks
            and v_parts["key_axis"] is not None
            and (scale is None or not plan.reads_index_outside(scale, self.key, blocks))
        )
        # every block size a positive multiple of the key tile (block_n on the host)
        divisors = [
            cx.host_expr(b.right, dims="sizes", params="params")
            for b in blocks
            if isinstance(b, ir.BinOp)
        ]
        aligned = " and ".join(f"({d}) > 0 and ({d}) % block_n == 0" for d in divisors) or "True"
        return {
            "tma": descriptors and k_parts["tma"] and v_parts["tma"],
            "k_coords": k_parts["coords"],
            "v_coords": v_parts["coords"],
            "v_coords_key_major": v_parts.get("coords_key_major", ""),
            "block_lines": block_lines,
            "key_blocks_aligned": aligned if block_lines or fp8_pv else None,
            # P meets V in FP8 where the kernel may take the value scale a tile at a time
            "fp8_pv": fp8_pv,
            # the fused kernel's FIXED_REFERENCE switch (fixed_reference; the split kernels
            # keep the online max)
            "fixed_reference": key_blocks and plan.fixed_reference_bound(self.k) is not None,
            "key_var": cx.index_var(self.k.key_axis.index),
            "key_dim": cx.safe_name(self.k.key_axis.dim),
            "k_tile": k_parts["k_tile"],
            "v_tile": v_parts["v_tile"],
            "gather_lines": self.gather_lines(env),
            "has_gathers": bool(self.gathered),
            "gather_take": [f"gather_{i} = gather_next_{i}" for i in range(len(self.gathered))],
            "gather_prefetch": self.gather_lines(env, "offs_next", "gather_next_"),
            "page_table": self.page_tables(env) if page_tables else None,
            "score_lines": self.score_lines(env, hoist=key_blocks)[1],
            "mask_all": _and(masks) or "True",
            "residual_mask": _and(residual),
            "bounded_keys": plan.bounds_read_tensors(mask_plan),
            "value_scale": (
                cx.triton_expr(self.k.value_scale, env) if self.k.value_scale is not None else None
            ),
            # FP8 tiles meet P in bfloat16, which holds every e4m3 value exactly: P (and P
            # weighed by a value scale of ~amax/448) would lose most of its small entries to
            # e4m3's subnormal range
            "pv_dtype": "tl.bfloat16" if self.k.fp8 else None,
            "spec": self.spec_lines,
        }

    def key_blocks(self) -> dict[ir.Expr, str]:
        """The key loop's block indices (plan.key_blocks): where every block size is a
        multiple of BLOCK_N (the host's KEY_BLOCKS_ALIGNED), a tile's keys share one block,
        and the kernel reads one value a tile: per key, the integer division and the load
        cost each thread one of each per key it holds."""
        return plan.key_blocks(self.k)

    def score_lines(
        self, env: cx.TritonEnv | None = None, hoist: bool = False
    ) -> tuple[list[str], list[str]]:
        """(prologue, loop) lines: ``qk_scale`` before the key loop, then qk to s2 a tile.

        Leading score mods that multiply the score by factors (``s = s * q_descale[b, h, m /
        block_m] * k_descale[b, h, n / block_n]``) fold into one multiply per score, beside
        the scale and log2(e): as separate lines they cost a multiply each per score, which
        the FP8 kernel, at half the MMA time, has no issue slots for. ``hoist``: factors that
        do not read the key index are computed once, before the loop (the kernel defines the
        query index there), not a tile."""
        env = env or self.env()
        factors, mods = plan.score_factors(self.k.score_mods)
        # uniform factors join the scale and log2(e) (plan.scaled_score_mods, outer_factors)
        score_scale, mods = (
            plan.scaled_score_mods(self.k.score_scale, mods)
            if not factors
            else (self.k.score_scale, mods)
        )
        scale = cx.triton_expr(score_scale, env)
        hoisted = [f for f in factors if hoist and self.key not in indices_of(f)]
        per_tile = [f"({cx.triton_expr(f, env)})" for f in factors if f not in hoisted]
        if hoisted:
            scale = " * ".join([f"({scale})", *(f"({cx.triton_expr(f, env)})" for f in hoisted)])
        # a row's or a tile's factors multiply first: one multiply per score after them
        tile_scale = f"({' * '.join(['qk_scale', *per_tile])})" if per_tile else "qk_scale"
        if not mods:
            # log2(e) folds into the scale: one multiply per score
            return [f"qk_scale = ({scale}) * {LOG2E!r}"], [f"s2 = qk * {tile_scale}"]
        lines = [f"s = qk * {tile_scale}"]
        lines += [f"s = {score_tile(mod, cx.triton_expr(mod, env))}" for mod in mods[:-1]]
        outer = plan.outer_factors(mods[-1])
        if outer is None:
            last = score_tile(mods[-1], cx.triton_expr(mods[-1], env))
            lines += [f"s = {last}", f"s2 = s * {LOG2E!r}"]
            return [f"qk_scale = {scale}"], lines
        factors_out, rest = (" * ".join(f"({cx.triton_expr(e, env)})" for e in p) for p in outer)
        lines.append(f"s2 = {score_tile(mods[-1], rest)} * score_out")
        return [f"qk_scale = {scale}", f"score_out = {factors_out} * {LOG2E!r}"], lines

    def kernel_params(self) -> tuple[list[str], list[str]]:
        """Kernel parameter names and the host expressions passed for them."""
        args = plan.launch_args(self.k)
        names = [a.var for a in args]
        host = [f"{a.type}({a.host})" if a.source == "param" else a.host for a in args]
        return names, host

    def tanh_approx(self) -> dict[str, str] | None:
        """The device helper ``_tanh_as``'s values: the condition on its ``float_type`` that
        picks tanh.approx.f32; None where no expression renders through it."""
        if self.float_type is None:
            return None
        types = " or ".join(f"float_type == tl.{d}" for d in plan.TANH_APPROX_DTYPES)
        return {"when": types}

    def contents(self, tile_index: bool, split: dict[str, Any] | None) -> list[str]:
        """Comment lines saying what the module holds, in the order it holds them."""
        name = cx.safe_name(self.k.name)
        lines = [
            "This module holds, in order:",
            f"  {name}(): the entry point; checks the inputs and calls _launch",
        ]
        if self.k.schedule == "naive":
            lines.append("  _launch and the kernels of the materialised schedule")
        elif split is not None and split["only"]:
            lines.append(f"  _launch_split and {split['kernel_fn']}: every call splits the keys")
        else:
            lines.append(f"  _launch and _attncc_{name}_fwd: fused attention, one pass over K, V")
            if tile_index:
                lines.append("  _tile_index: the lists of partial and full key tiles it walks")
            if split is not None:
                lines.append(
                    f"  _launch_split and {split['kernel_fn']}: calls of at most "
                    f"{split['max_queries']} queries split the keys instead"
                )
        lines.append("  host helpers (argument checks, launch configurations), device helpers")
        return lines

    def key_length_args(
        self, runtime_ints: list[str]
    ) -> dict[str, tuple[str, str, int, bool]] | None:
        """plan.key_length_args, None where a subscript check reads the key length too,
        without the params a check reads, each reading with whether Triton specializes the
        argument (not one of ``runtime_ints``)."""
        found = plan.key_length_args(self.k)
        checks = host.subscript_checks(self.k)
        if found is None or any(self.k.key_axis.dim in c["reads"] for c in checks):
            return None
        named = {name for c in checks for name in c["params"]}
        return {
            var: (*at, var not in runtime_ints)
            for var, at in found.items()
            if at[0] != "param" or at[1] not in named
        }

    def runtime_ints(self, extra: tuple[str, ...] = ()) -> list[str]:
        """Integer kernel parameters Triton must not specialize on: batch and head counts,
        head dims, int params (a window) and the log-sum-exp's outer strides (multiples of
        the query length). Triton compiles a new kernel for each int's "== 1" and "divisible
        by 16" cases, so a batch of 8 after one of 16 (or of 1), or a new window, recompiled
        every launch configuration. The query and key lengths stay specialized: their
        divisibility by 16 is worth 13% to soft-capping (1059 against 1215 us at 4k on an H200,
        docs/performance.md), and costs one compile more for lengths off a multiple of 16.
        Input and output strides stay specialized too: their divisibility vectorizes loads."""
        args = plan.launch_args(self.k)
        lengths = {cx.dim_var(self.k.key_axis.dim)}
        if self.k.query_axis is not None:
            lengths.add(cx.dim_var(self.k.query_axis.dim))
        sizes = [
            a.var
            for a in args
            if a.source in ("dim", "divisor", "param") and a.type == "int" and a.var not in lengths
        ]
        lse_strides = [a.var for a in args if a.source == "stride" and a.host.startswith("lse.")]
        return [*lse_strides[:-1], *sizes, *extra]

    def batch_lines(self, axes: tuple[ir.Axis, ...] | None = None) -> list[str]:
        """Lines decomposing ``pid_batch`` into the indices of ``axes`` (all batch axes)."""
        axes = self.k.batch_axes if axes is None else axes
        if not axes:
            return []
        # int64 from here: batch offsets (b * stride) pass 2**31 elements on large inputs
        lines = ["rest = pid_batch.to(tl.int64)"]
        for axis in reversed(axes[1:]):
            var, size = cx.index_var(axis.index), cx.dim_var(axis.dim)
            lines += [f"{var} = rest % {size}", f"rest = rest // {size}"]
        lines.append(f"{cx.index_var(axes[0].index)} = rest")
        return lines

    def host_tables(self) -> dict[str, Any]:
        return host.tables(self.k)

    def doc(self) -> str:
        return host.doc(self.k)

    def header(self) -> list[str]:
        return host.header(self.k, self.source_text)

    def split(self) -> dict[str, Any] | None:
        """Render context of the split-KV kernels, or None when this kernel has none.

        One program takes one kv head of one batch entry and one chunk of keys; its rows are
        every (query head of the group, query) pair, so each K/V tile is read once per group.
        """
        k = self.k
        if k.schedule != "split_kv" and not k.split_max_queries:
            return None
        group = k.group
        head = group.head.index if group else None
        mapping = group_subscript(k)
        kv_head = cx.index_var(group.kv_dim) if group else None
        program_axes = [
            ir.Axis(group.kv_dim, group.kv_dim) if group and a.index == head else a
            for a in k.batch_axes
        ]
        names = [
            kv_head if group and a.index == group.kv_dim else cx.index_var(a.index)
            for a in program_axes
        ]
        lines = ["rest = pid_batch.to(tl.int64)"] if names else []
        for axis, var in reversed(list(zip(program_axes, names, strict=True))[1:]):
            size = cx.dim_var(axis.dim)
            lines += [f"{var} = rest % {size}", f"rest = rest // {size}"]
        if names:
            lines.append(f"{names[0]} = rest")

        # rows: (query head within the group, query); vectors [BLOCK_M, 1]
        indices = {a.index: cx.index_var(a.index) for a in k.batch_axes}
        vector = {self.key}
        if head is not None:
            vector.add(head)
        if self.query:
            vector.add(self.query)
        indices[self.key] = cx.index_var(self.key)
        if self.query:
            indices[self.query] = cx.index_var(self.query)
        env = cx.TritonEnv(indices, self.tensors, frozenset(vector), float_type=self.float_type)

        def rows_operand(operand: ir.Operand, col: str) -> str:
            parts = []
            for axis, sub in enumerate(operand.indices):
                stride = cx.stride_var(operand.tensor, axis)
                if isinstance(sub, ir.Index) and sub.name == col:
                    parts.append(
                        f"offs_{'d' if col == k.head_axis.index else 'dv'}[None, :] * {stride}"
                    )
                else:
                    parts.append(f"({cx.triton_expr(sub, env)}) * {stride}")
            return " + ".join(parts)

        replaced = {mapping: kv_head} if mapping is not None and kv_head else None
        scalar_env = replace(env, vector_indices=frozenset())
        k_parts = self.kv_operand(k.key, k.head_axis.index, scalar_env, replaced)
        v_parts = self.kv_operand(k.value, k.value_axis.index, scalar_env, replaced)

        out = k.output
        out_offset = " + ".join(
            f"offs_dv[None, :] * {cx.stride_var(out.name, axis)}"
            if index == k.value_axis.index
            else f"({indices[index]}) * {cx.stride_var(out.name, axis)}"
            for axis, index in enumerate(out.indices)
        )
        lse_axes = [a.index for a in k.batch_axes] + ([self.query] if self.query else [])
        lse_offset = " + ".join(
            f"({indices[index]}) * lse_stride_{axis}" for axis, index in enumerate(lse_axes)
        )
        plan = k.mask_plan
        assert plan is not None

        prologue, _ = self.score_lines(env)
        program_dims = [a.dim for a in program_axes]
        group_host = f"sizes[{group.head.dim!r}] // sizes[{group.kv_dim!r}]" if group else "1"
        rows_host = f"sizes[{k.query_axis.dim!r}]" if k.query_axis else "1"
        runtime_ints = self.runtime_ints(("GROUP", "M_ROWS", "ROWS"))
        return {
            "kernel_fn": f"_attncc_{cx.safe_name(k.name)}_split",
            "combine_fn": f"_attncc_{cx.safe_name(k.name)}_combine",
            "runtime_ints": runtime_ints,
            "key_size": cx.dim_var(k.key_axis.dim),
            "length_args": self.key_length_args(runtime_ints),
            "splits_keys_host": (
                "True"
                if k.schedule == "split_kv"
                else f"{rows_host} <= {k.split_max_queries} and {group_host} * {rows_host} <= 128"
            ),
            "batch_lines": lines,
            "head_var": cx.index_var(head) if head else None,
            "kv_head": kv_head,
            "query_var": cx.index_var(self.query) if self.query else None,
            "q": rows_operand(k.query, k.head_axis.index),
            "k": k_parts,
            "v": v_parts,
            "o": out_offset,
            "lse": lse_offset or "0",
            "prologue_lines": prologue,
            # the visible key range never reads the query head (split_kv_blocker), so the
            # fused kernel's bounds hold for the split rows too
            "bounds": self.bounds(),
            "loop": self.loop(env, k_parts, v_parts, page_tables=True),
            "programs_host": " * ".join(f"sizes[{d!r}]" for d in program_dims) or "1",
            "group_host": group_host,
            "max_queries": k.split_max_queries,
            "only": k.schedule == "split_kv",
        }

    def fused(self) -> dict[str, Any]:
        k = self.k
        assert k.tiling is not None and k.mask_plan is not None
        # the naive kernels take this loop's score and mask lines without its tiles' starts
        tiled = k.schedule != "naive"
        prologue, _ = self.score_lines(hoist=tiled)
        scalars = self.env(vector=False)
        reference = plan.fixed_reference(k)
        if reference is not None:
            prologue.append(f"score_ref = {cx.triton_expr(reference, scalars)}")
        k_parts = self.kv_operand(k.key, k.head_axis.index, scalars)
        v_parts = self.kv_operand(k.value, k.value_axis.index, scalars)
        kernel_params, launch_args = self.kernel_params()
        tile_index = self.tile_index()
        split = self.split()
        pairs = tiled and plan.keys_grow_with_row(k)
        args = plan.launch_args(k)
        o, lse = self.output()
        env = self.env()
        loop = self.loop(env, k_parts, v_parts, descriptors=True, key_blocks=tiled)
        query = k.query_axis
        batch_programs = " * ".join(f"sizes[{a.dim!r}]" for a in k.batch_axes) or "1"
        return {
            "header": self.header(),
            "name": cx.safe_name(k.name),
            "entry": templating.entry_name(k.name),
            "doc": self.doc(),
            "kernel_fn": f"_attncc_{cx.safe_name(k.name)}_fwd",
            "kernel_params": kernel_params,
            "kernel_param_lines": plan.arg_lines(args, kernel_params),
            "launch_arg_lines": plan.arg_lines(args, launch_args),
            "contents": self.contents(tile_index is not None, split),
            "spec_lines": self.spec_lines,
            "uses_tma": bool(k_parts["tma"] and v_parts["tma"]),
            "uses_tanh": "tanh" in plan.functions_used(k),
            "tanh_approx": self.tanh_approx(),
            "uses_pow": "pow" in plan.functions_used(k),
            "row_lse": True,  # the forward stores log-sum-exps
            "weights_as": reference is not None and tiled,  # the fixed reference's row sums
            "fast_division": bool(plan.divisor_dims(k)),
            # whether a program pairs its query tiles changes with the call's size: a
            # runtime value, so calls on both sides of the rule share one compiled kernel
            "runtime_ints": self.runtime_ints(
                ("KEY_TILES",) * bool(tile_index) + ("paired",) * pairs
            ),
            "launch_args": launch_args,
            "batch_lines": self.batch_lines(),
            "rows": cx.dim_var(query.dim) if query else "1",
            "rows_host": f"sizes[{query.dim!r}]" if query else "1",
            "batch_programs": batch_programs,
            "host_key_size": f"sizes[{k.key_axis.dim!r}]",
            "query_var": cx.index_var(query.index) if query else None,
            "q_name": k.query.tensor,
            "k_name": k.key.tensor,
            "v_name": k.value.tensor,
            "o_name": k.output.name,
            "q": self.operand(k.query, self.query, k.head_axis.index),
            "k": k_parts,
            "v": v_parts,
            "o": o,
            "lse": lse,
            "prologue_lines": prologue,
            "loop": loop,
            "uses_fp8_pv": bool(loop["fp8_pv"] and loop["tma"]),
            "tile_index": tile_index,
            # query tiles whose keys grow with the row (causal) may run in pairs (config
            # "paired"): the last with the first, the second last with the second, ...
            "pairs": pairs,
            "bounds": self.bounds(),
            "output": {
                "dims": list(k.output.dims),
                "lse_dims": [a.dim for a in k.batch_axes] + ([query.dim] if query else []),
                "lse_permutation": list(plan.lse_permutation(k)),
            },
            "head_dim": k.head_axis.dim,
            # Hopper's FP8 MMAs take a reduction of 32 elements at least (a 16-wide head
            # tile failed to compile at D=16, H100); 16-bit ones take 16
            "min_head_block": 32 if k.fp8 else 16,
            "value_dim": k.value_axis.dim,
            "tiling_rules": [
                {
                    "max_head_dim": max_head_dim,
                    "block_m": c.block_m,
                    "block_n": c.block_n,
                    "num_warps": c.num_warps,
                    "num_stages": c.num_stages,
                    "tma": int(c.tma),
                }
                for max_head_dim, c in k.tiling.rules
            ],
            "split": split,
            "sink": (
                f"({cx.triton_expr(k.sink, env)}) * {LOG2E!r}" if k.sink is not None else None
            ),
            **self.host_tables(),
        }


def render(kernel: ir.AttentionKernel, spec: ast.Spec | str = "") -> Rendered:
    """Generated module source for ``kernel``; its entry point is attncc_<spec name>.
    ``spec`` is the parsed spec (its statements' lines go into comments beside the code that
    implements them), or only its text (no statement comments)."""
    context = _Context(kernel, spec)
    template = {
        "fused": "fused.py.jinja",
        "naive": "naive.py.jinja",
        "split_kv": "split_kv.py.jinja",
    }[kernel.schedule or "fused"]
    values = context.fused()
    source = environment().get_template(template).render(**values)
    return Rendered(source, values["entry"], template)
