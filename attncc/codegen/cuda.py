"""CUDA backend: lower an optimised ``AttentionKernel`` to CUDA C++ (and its Python host module).

The same IR and pass results as the Triton backend (``codegen/plan.py`` classifies operand
subscripts and tile key bounds for both); all decisions (names, offsets, bounds, score and
mask lines, launch tables) are made here, and ``templates/cuda`` only places the strings.

What comes out: one CUDA source per kernel family the host may launch (``Rendered.sources``,
FAMILIES: the sm_90a fused kernel, the one-block-a-tile fused kernel, the fp32 kernels,
split-KV), each holding only its kernels after a header comment, with the spec-independent
device helpers in shipped headers it includes (``headers()``); the first family's source is
``Rendered.source``, what ``attncc compile --target cuda`` prints. And a Python host module
(``Rendered.host``) that binds and checks arguments like the Triton module, picks a family
and a compile-time configuration per call (float type, padded head dims, tile sizes),
compiles that family on first use with NVRTC through ``attncc.runtime.nvrtc`` and launches it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jinja2

from attncc.codegen import cuda_exprs as cu
from attncc.codegen import cuda_wgmma, host, plan, templating
from attncc.codegen import exprs as cx
from attncc.ir import nodes as ir
from attncc.ir.derivative import NoDerivative, score_chain
from attncc.ir.verify import indices_of, subexprs
from attncc.passes.schedule import group_subscript
from attncc.spec import ast
from attncc.version import __version__

CUDA_TEMPLATE_DIR = templating.TEMPLATES / "cuda"
# head dims are padded to one of these (tensor-core tiles need multiples of 16; the
# swizzled shared-memory layout multiples of 64); larger ones go to the Triton backend
PADDED_HEAD_DIMS = (64, 128, 256)
# The kernel families: one CUDA source each (templates/cuda/family_<name>.cu.jinja), holding
# only the kernels the host launches together, so a call compiles (NVRTC) the family it runs
# and a reader reads one kernel, not every variant behind macros.
FAMILIES = {
    "hopper": "sm_90a: the fused kernel of 16-bit prefill on an sm_90 GPU",
    "mma": "sm_80+: the fused kernel on mma.sync, or one sm_90a wgmma block a tile",
    "fma": "fp32 inputs: a warp a row on FMA units",
    "split": "split-KV on mma.sync: decode and few-query calls",
    "backward": "sm_90a: the gradients of Q, K and V (no tile index)",
}
# The shipped headers every family includes (the Hopper one where its kernels use it),
# spec-independent: device helpers, warp-group MMAs, TMA and barriers
HEADERS = ("attncc_cuda.cuh", "attncc_hopper.cuh")
_FAMILY_HEADERS = {
    "hopper": HEADERS,
    "mma": HEADERS,
    "fma": HEADERS[:1],
    "split": HEADERS[:1],
    "backward": HEADERS,
}


def environment() -> jinja2.Environment:
    return templating.environment("cuda")


@dataclass(frozen=True)
class Rendered:
    source: str  # CUDA C++: the first family's source (what the default call runs)
    host: str  # the Python host module
    entry: str
    sources: tuple[tuple[str, str], ...] = ()  # (family, CUDA C++), the default one first
    headers: tuple[tuple[str, str], ...] = ()  # (name, text) of the shipped headers

    def standalone(self, source: str | None = None) -> str:
        """``source`` (the first family's by default) with the shipped headers it includes
        inlined in their place: one file nvcc compiles on its own."""
        return inline_headers(self.source if source is None else source, self.headers)


def inline_headers(source: str, headers: tuple[tuple[str, str], ...]) -> str:
    """Replace each ``#include "<header>"`` line of ``source`` by the header's text (once:
    the headers' include guards keep a second copy empty)."""
    texts = dict(headers)
    seen: set[str] = set()

    def expand(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            name = line.strip().removeprefix('#include "').removesuffix('"')
            if line.startswith('#include "') and name in texts:
                if name not in seen:
                    seen.add(name)
                    out.append(expand(texts[name]))
                continue
            out.append(line)
        return "".join(out)

    return expand(source)


# the kernels' element type (elem_t) for each call dtype
_ELEMENT_TYPES = {"float32": "float", "float16": "f16_t", "bfloat16": "bf16_t"}


@functools.cache
def headers() -> tuple[tuple[str, str], ...]:
    """The shipped headers' (name, text): rendered from templates/cuda/<name>.jinja, the same
    for every spec."""
    env = environment()
    values = {
        "version": __version__,
        "wgmma": cuda_wgmma.instructions(),
        "uses_tanh": True,
        "tanh_approx": {
            "types": [_ELEMENT_TYPES[d] for d in plan.TANH_APPROX_DTYPES],
        },
        "fast_division": True,
    }
    return tuple((name, env.get_template(f"{name}.jinja").render(**values)) for name in HEADERS)


class _Context:
    def __init__(self, kernel: ir.AttentionKernel, spec: ast.Spec | str) -> None:
        self.k = kernel
        self.source_text = spec if isinstance(spec, str) else spec.source
        self.spec_lines = plan.spec_lines(None if isinstance(spec, str) else spec)
        self.tensors = {t.name: t for t in kernel.tensors}
        self.query = kernel.query_axis.index if kernel.query_axis else None
        self.key = kernel.key_axis.index
        self.key_var = cx.index_var(self.key)
        self.name = cx.safe_name(kernel.name)

    # -------------------------------------------------------------- expressions

    def env(self, split: bool, bounded: frozenset[str] | None = None) -> cu.CudaEnv:
        """Every index reads as its ``i_`` variable; the templates declare them per program
        (batch indices), per row (query, and the query head in split-KV) and per key."""
        axes = [*self.k.batch_axes, self.k.key_axis]
        if self.k.query_axis:
            axes.append(self.k.query_axis)
        indices = {a.index: cx.index_var(a.index) for a in axes}
        if bounded is None:
            rows = {self.key} | ({self.query} if self.query else set())
            if split and self.k.group:
                rows.add(self.k.group.head.index)
            bounded = frozenset(rows)
        return cu.CudaEnv(indices, self.tensors, bounded)

    def bounds(self, split: bool) -> dict[str, str]:
        """Visible keys of a tile, from its first and last query (``m_first``/``m_last``),
        clamped into [0, N)."""
        assert self.k.mask_plan is not None
        key_size = "key_size"
        rows = {"first": "m_first", "last": "m_last"}
        limits = {"max": ("max", "0"), "min": ("min", key_size)}
        result = {}
        for name, (bounds, combine) in plan.key_range(self.k.mask_plan).items():
            func, limit = limits[combine]
            parts = []
            for bound, row in bounds:
                env = self.env(split, frozenset({self.key}))
                if self.query:
                    env = cu.CudaEnv(
                        {**env.indices, self.query: rows[row]}, env.tensors, env.bounded
                    )
                parts.append(f"(int)({cu.cuda_expr(bound.expr, env)})")
            result[name] = templating.nested(func, [*parts, limit])
        return result

    def _scale(self, env: cu.CudaEnv, scale: ir.Expr | None = None) -> str:
        scale = self.k.score_scale if scale is None else scale
        text = cu.cuda_expr(scale, env)
        return text if scale.type == "float" else f"(float)({text})"

    def score_lines(self, env: cu.CudaEnv) -> list[str]:
        exp_scale = self.exp_scale(env)
        if exp_scale is not None:
            # log2(e) folds into the scale: one multiply per score
            return [f"float s2 = qk * {exp_scale};"]
        if self.score_factor(env) is not None:
            return ["float s2 = qk * score_factor;"]
        # uniform factors join the scale and log2(e) (plan.scaled_score_mods, outer_factors)
        scale, mods = plan.scaled_score_mods(self.k.score_scale, self.k.score_mods)
        if not mods:
            return [f"float s2 = qk * (({self._scale(env, scale)}) * ATTNCC_LOG2E);"]
        lines = [f"float s = qk * ({self._scale(env, scale)});"]
        lines += [f"s = {cu.cuda_expr(mod, env)};" for mod in mods[:-1]]
        outer = plan.outer_factors(mods[-1])
        if outer is None:
            return [*lines, f"s = {cu.cuda_expr(mods[-1], env)};", "float s2 = s * ATTNCC_LOG2E;"]
        factors, rest = (" * ".join(f"({cu.cuda_expr(e, env)})" for e in part) for part in outer)
        return [*lines, f"float s2 = ({factors} * ATTNCC_LOG2E) * {rest};"]

    def backward_chain(self, env: cu.CudaEnv) -> list[str] | None:
        """The sm_90a backward's lines from a raw dot product ``qk`` to the score ``s`` and
        ``fac``, d(s)/d(qk) over the scale (the chain rule through each modification, the
        factor taken at the score the modification reads: ``fac`` is declared 1 before
        them); None where the scores are the scaled dot products."""
        mods = self.k.score_mods
        if not mods:
            return None
        lines = [f"float s = qk * ({self._scale(env)});"]
        for mod, (d_score, _) in zip(mods, score_chain(mods), strict=True):
            if d_score != ir.Const(1.0, "float"):
                lines.append(f"fac *= {cu.cuda_expr(d_score, env)};")
            lines.append(f"s = {cu.cuda_expr(mod, env)};")
        return lines

    def score_row_lines(self, env: cu.CudaEnv) -> list[str]:
        """Lines where a row's scores of a tile start (its row index in scope): the row's
        ``score_factor`` (hopper.cu.jinja's seen_tile computes ``score_factors`` before the
        tile's MMAs)."""
        if self.score_factor(env) is None:
            return []
        return ["const float score_factor = score_factors[mt][h];"]

    def score_factor(self, env: cu.CudaEnv) -> str | None:
        """Where every score mod of an FP8 kernel only multiplies the score (its descales:
        ``s * q_descale[..] * k_descale[..]``), the product of the scale, those factors and
        log2(e): one number a row and tile, one multiply a score. Rendered into each score,
        the factors' guarded loads were not shared between scores: 526 global loads in the
        kernel's SASS, now 30, and 1242 us a call, then 935 (1,16,8192,128, H200). Computed
        before the tile's MMAs, not after S's wait, the loads' latency runs under the MMAs:
        925.6 -> 787.2 us full, 566.4 -> 480.0 causal (same shape and GPU, ``benchmarks/ab.py``)."""
        factors, mods = plan.score_factors(self.k.score_mods)
        if not factors or mods or not self.k.fp8:  # FP8: the fused sm_90a kernel alone
            return None
        if any(plan.reads_index_outside(f, self.key, env.values) for f in factors):
            return None  # a factor a key (k_descale[b, h, n]): a multiply a score
        parts = [f"({self._scale(env)})", *(f"({cu.cuda_expr(f, env)})" for f in factors)]
        return " * ".join([*parts, "ATTNCC_LOG2E"])

    def key_blocks(self) -> dict[ir.Expr, str]:
        """FP8 kernels' key blocks (plan.key_blocks: ``k_descale[b, h, n / block_n]``),
        computed once a tile (the host checks every block is a multiple of the key tile),
        as the Triton backend's: a load a tile, not one a score."""
        return plan.key_blocks(self.k) if self.k.fp8 else {}

    def exp_scale(self, env: cu.CudaEnv) -> str | None:
        """The log2-domain score scale, when scores are the scaled dot products and nothing
        else (no score modification): the prefill kernel then keeps raw dot products and
        applies the scale inside each exp2's FFMA."""
        if self.k.score_mods:
            return None
        return f"(({self._scale(env)}) * ATTNCC_LOG2E)"

    def masks(self, env: cu.CudaEnv) -> tuple[str, str | None]:
        plan_ = self.k.mask_plan
        assert plan_ is not None
        partial = [f"{self.key_var} < key_size"]
        partial += [f"({cu.cuda_expr(m, env)})" for m in self.k.masks]
        residual = [f"({cu.cuda_expr(m, env)})" for m in plan_.residual]
        return " && ".join(partial), (" && ".join(residual) or None)

    def bounds_mask(self, env: cu.CudaEnv) -> str:
        """The masks folded into the key interval, as the interval's per-row bounds tested
        per score (exact: mask-analysis folds a mask only where a key is inside iff it
        holds): all a tile needs whose tile-index bit says every residual mask holds on it
        whole, where row_interval's form is not taken (score modifications)."""
        plan_ = self.k.mask_plan
        assert plan_ is not None
        key = self.key_var
        tests = [f"{key} < key_size"]
        tests += [f"{key} >= ({cu.cuda_expr(b.expr, env)})" for b in plan_.lower]
        tests += [f"{key} < ({cu.cuda_expr(b.expr, env)})" for b in plan_.upper]
        return " && ".join(tests)

    def row_interval(self, env: cu.CudaEnv) -> dict[str, str | None]:
        """The masks folded into the key interval as one row's visible keys [lo, hi), both
        clamped into [0, N] (exact: mask-analysis folds a mask only where a key is inside
        iff it holds); lo is None without lower bounds. A partial tile then tests each
        score's column against two per-row numbers, not each folded mask against its key
        (a sliding window's three tests a score become two: 3% faster at head dim 64).
        Only where the scores are raw dot products: with score modifications the kernel
        ran slower (soft-capping 30%, ALiBi 8-16%; H100)."""
        plan_ = self.k.mask_plan
        assert plan_ is not None
        lower = [f"(int)({cu.cuda_expr(b.expr, env)})" for b in plan_.lower]
        upper = [f"(int)({cu.cuda_expr(b.expr, env)})" for b in plan_.upper]
        # the score's test: its column offset in the thread's fragment (j * 8 + e) against
        # the row's bounds less the thread's first column (rel_lo, rel_hi: prefill_scores)
        test = "j * 8 + e < rel_hi"
        return {
            "lo": templating.nested("max", [*lower, "0"]) if lower else None,
            "hi": templating.nested("max", [templating.nested("min", [*upper, "key_size"]), "0"]),
            "test": f"j * 8 + e >= rel_lo && {test}" if lower else test,
        }

    # -------------------------------------------------------------- operands

    def row_operand(self, operand: ir.Operand, col: str, env: cu.CudaEnv) -> tuple[str, str]:
        """Per-row offset (base included) and the stride along the head dim."""
        offset, col_stride = [], "0"
        for part in plan.operand_parts(operand, None, col):
            stride = cx.stride_var(operand.tensor, part.axis)
            if part.kind == "col":
                col_stride = stride
            else:
                offset.append(f"({cu.cuda_expr(part.sub, env)}) * {stride}")
        return " + ".join(offset) or "0", col_stride

    def kv_operand(
        self,
        operand: ir.Operand,
        col: str,
        env: cu.CudaEnv,
        replaced: dict[ir.Expr, str] | None = None,
    ) -> dict[str, str]:
        """Keys or values: a per-program base, the offset of key ``i_<key>`` (a stride step,
        or a gather through a page table), the head-dim stride."""
        base, key, col_stride = [], [], "0"
        keys = cu.CudaEnv(env.indices, env.tensors, frozenset({self.key}))
        for part in plan.operand_parts(operand, None, col, self.key, replaced):
            stride = cx.stride_var(operand.tensor, part.axis)
            if part.kind == "key":
                key.append(f"{self.key_var} * {stride}")
            elif part.kind == "col":
                col_stride = stride
            elif part.kind == "replaced":
                base.append(f"{part.var} * {stride}")
            elif part.kind == "gather":
                key.append(f"({cu.cuda_expr(part.sub, keys)}) * {stride}")
            else:
                base.append(f"({cu.cuda_expr(part.sub, env)}) * {stride}")
        return {
            "base": " + ".join(base) or "0",
            "key": " + ".join(key) or "0",
            "col": col_stride,
        }

    def output_offsets(self) -> tuple[str, str, str]:
        """Per-row offsets of the output and the log-sum-exp, and the output's value stride."""
        out = self.k.output
        offset, col = [], "0"
        for axis, index in enumerate(out.indices):
            stride = cx.stride_var(out.name, axis)
            if index == self.k.value_axis.index:
                col = stride
            else:
                offset.append(f"{cx.index_var(index)} * {stride}")
        lse_axes = [a.index for a in self.k.batch_axes] + ([self.query] if self.query else [])
        lse = [f"{cx.index_var(index)} * lse_stride_{i}" for i, index in enumerate(lse_axes)]
        return " + ".join(offset) or "0", " + ".join(lse) or "0", col

    # -------------------------------------------------------------- modes

    def mode(
        self,
        split: bool,
        batch_lines: list[str],
        row_lines: list[str],
        row_ok: str,
        replaced: dict[ir.Expr, str] | None,
    ) -> dict[str, Any]:
        k = self.k
        env = self.env(split)
        program = cu.CudaEnv(env.indices, env.tensors, frozenset())
        q_offset, q_col = self.row_operand(k.query, k.head_axis.index, env)
        o_offset, lse_offset, _ = self.output_offsets()
        mask_partial, mask_full = self.masks(env)
        return {
            "batch_lines": batch_lines,
            "row_lines": row_lines,
            "row_ok": row_ok,
            "row_first": cx.index_var(self.query) if self.query else "0",
            "q_offset": q_offset,
            "q_col": q_col,
            "o_offset": o_offset,
            "lse_offset": lse_offset,
            "k": self.kv_operand(k.key, k.head_axis.index, program, replaced),
            "v": self.kv_operand(k.value, k.value_axis.index, program, replaced),
            "score_lines": self.score_lines(env),
            "score_row_lines": self.score_row_lines(env),
            "exp_scale": self.exp_scale(env),
            "mask_partial": mask_partial,
            "mask_full": mask_full,
            "bounds": self.bounds(split),
            "spec": self.spec_lines,
        }

    @staticmethod
    def decompose(axes: list[tuple[str, str]]) -> list[str]:
        """Statements splitting ``pid_batch`` into (variable, dim) axes, last fastest."""
        if not axes:
            return []
        lines = ["int rest = pid_batch;"]
        for var, dim in reversed(axes[1:]):
            size = cx.dim_var(dim)
            lines += [f"const int {var} = rest % {size};", f"rest /= {size};"]
        lines.append(f"const int {axes[0][0]} = rest;")
        return lines

    def fused_mode(self) -> dict[str, Any]:
        k = self.k
        batch = self.decompose([(cx.index_var(a.index), a.dim) for a in k.batch_axes])
        if self.query and k.query_axis:
            rows = [f"const int {cx.index_var(self.query)} = m_start + r;"]
            row_ok = f"{cx.index_var(self.query)} < {cx.dim_var(k.query_axis.dim)}"
        else:
            rows, row_ok = [], "r < 1"
        values = self.mode(False, batch, rows, row_ok, None)
        values["rows"] = cx.dim_var(k.query_axis.dim) if k.query_axis else "1"
        values["fp8"] = k.fp8
        values["scale"] = self._scale(self.env(False))
        values["out_type"] = "bf16_t" if k.fp8 else "elem_t"
        env = self.env(False)
        blocks = self.key_blocks()
        values["key_blocks"] = [
            f"const int {name} = n0 / ({cu.cuda_expr(block.right, env)});"
            for block, name in blocks.items()
            if isinstance(block, ir.BinOp)
        ]
        # FP8 reads its key blocks' values once a tile, its value scale too
        named = cu.CudaEnv(env.indices, env.tensors, env.bounded, env.score, blocks)
        values["score_lines"] = self.score_lines(named)
        values["score_row_lines"] = self.score_row_lines(named)
        values["score_factor"] = self.score_factor(named)
        values["value_scale"] = None
        if k.value_scale is not None:
            values["value_scale"] = cu.cuda_expr(k.value_scale, named)
        assert k.mask_plan is not None
        # the keys whose K/V rows are zero-filled, not read: past the cache and, where a key
        # bound reads a tensor (cache lengths), outside [lo, hi) too: there they may be
        # unwritten cache memory (as the split-KV kernel treats them always)
        key = self.key_var
        values["key_outside"] = f"{key} >= key_size"
        if plan.bounds_read_tensors(k.mask_plan):
            values["key_outside"] += f" || {key} < lo || {key} >= hi"
        values["tile_index"] = self.tile_index(self.env(False))
        values["fixed_reference"] = self.fixed_reference(self.env(False))
        values["hoisted"] = None
        values["keys_early"] = False
        # partial tiles test the row's key interval alone where every mask folded into it
        interval = None if k.score_mods else self.row_interval(self.env(False))
        values["partial_interval"] = None if k.mask_plan.residual else interval
        if values["tile_index"] is not None:
            # a tile takes the mask-free path only when its full bit says every separable
            # mask holds (and no other residual mask exists): no mask is left to apply; one
            # whose full bit is set but which crosses the interval's bounds tests those alone
            values["mask_full"] = None
            values["hoisted"] = self.hoisted_sides(self.env(False))
            # key sides that read memory (document ids) load before the K wait
            # (prefill.cu.jinja's key_sides_early); plain key indices (varlen's bounds) stay
            # where they are used: held across the MMAs they cost registers and hide nothing
            assert k.tile_index is not None
            values["keys_early"] = any(
                isinstance(e, ir.Load) for sep in k.tile_index.masks for e in subexprs(sep.key)
            )
            values["mask_bounds"] = self.bounds_mask(self.env(False))
            values["bounds_interval"] = interval
        return values

    def fixed_reference(self, env: cu.CudaEnv) -> str | None:
        """The fixed softmax reference (``plan.fixed_reference``, log2 units), which the
        sm_90a kernel compiled with ATTNCC_FIXED_REFERENCE takes as every row's: no row max
        and no rescale of O. The score lines then end in log2 units (a bound needs a score
        modification, so no exp_scale is folded into the exp2)."""
        reference = plan.fixed_reference(self.k)
        if reference is None or self.exp_scale(env) is not None:
            return None
        return cu.cuda_expr(reference, env)

    def hoisted_sides(self, env: cu.CudaEnv) -> dict[str, Any]:
        """Partial tiles of the fused kernel read each separable mask's sides once: the key
        side once per key of the thread's fragment (``kv<i>``), the row side once per row
        (``rv<i>[mt][h]``), not both once per score (a document id is a global load: 128 of
        them a thread and tile before). The comparisons themselves render unchanged."""
        index = self.k.tile_index
        assert index is not None
        rows, keys, values = [], [], {}
        for i, sep in enumerate(index.masks):
            rows.append(
                {"name": f"rv{i}", "fn": f"row_side{i}", "expr": cu.cuda_expr(sep.row, env)}
            )
            keys.append({"name": f"kv{i}", "expr": cu.cuda_expr(sep.key, env)})
            values[sep.row] = f"rv{i}[mt][h]"
            values[sep.key] = f"kv{i}"
        mask, _ = self.masks(cu.CudaEnv(env.indices, env.tensors, env.bounded, env.score, values))
        return {"row_sides": rows, "key_sides": keys, "mask": mask}

    def tile_index(self, env: cu.CudaEnv) -> dict[str, Any] | None:
        """The fused kernel's tile classification (ir.TileIndex, as the Triton backend's
        index builder): value ranges of each separable mask's row and key sides, and the
        live / full tests of a key tile. Integers compare as int64; a float side makes both
        float, a NaN widening its range to everything (never dead through !=, never full)."""
        index = self.k.tile_index
        if index is None or self.query is None:
            return None
        masks, live, full, narrow, narrowing = [], [], [], [], []
        for i, sep in enumerate(index.masks):
            exact = sep.row.type != "float" and sep.key.type != "float"
            ctype = "long long" if exact else "float"
            lo, hi = (
                ("v", "v") if exact else ("(v == v ? v : -ATTNCC_INF)", "(v == v ? v : ATTNCC_INF)")
            )
            masks.append(
                {
                    "type": ctype,
                    "row": f"({ctype})({cu.cuda_expr(sep.row, env)})",
                    "key": f"({ctype})({cu.cuda_expr(sep.key, env)})",
                    "lo": lo,
                    "hi": hi,
                    "lo_init": "0x7fffffffffffffffLL" if exact else "ATTNCC_INF",
                    "hi_init": "(-0x7fffffffffffffffLL - 1)" if exact else "-ATTNCC_INF",
                }
            )
            names = (f"row_lo_{i}", f"row_hi_{i}", f"key_lo_{i}", f"key_hi_{i}")
            live.append(f"({plan.can_meet(sep.op, *names, logic=plan.CUDA_LOGIC)})")
            full.append(f"({plan.always(sep.op, *names, logic=plan.CUDA_LOGIC)})")
            if exact and sep.key == ir.Index(self.k.key_axis.index) and sep.op != "!=":
                # a mask of the key index itself: tile t's keys are [t * BN, t * BN + BN), so
                # the tiles no row of the block can see are known before any key is read
                first, last = "(long long)t * BN", "((long long)t * BN + BN - 1)"
                tile = (f"block_lo_{i}", f"block_hi_{i}", first, last)
                narrow.append(f"({plan.can_meet(sep.op, *tile, logic=plan.CUDA_LOGIC)})")
                narrowing.append({"index": i, "type": ctype})
        # variant 2's index is built per call by a kernel of its own: one program per
        # (index program, query block), the index programs those of index.axes (heads share
        # one index where only document ids per sequence are read)
        programs = plan.index_programs(index.axes)
        return {
            "masks": masks,
            "live": " && ".join(live),
            "narrow": "".join(f" && {test}" for test in narrow),
            "narrowing": narrowing,
            "full": " && ".join(full) if index.full else "false",
            "build_fn": f"attncc_{self.name}_tile_index",
            "batch_lines": self.decompose([(cx.index_var(a.index), a.dim) for a in index.axes]),
            "program": programs.program,
            "programs_host": programs.count_host,
        }

    def split_mode(self) -> dict[str, Any] | None:
        """Split-KV: one program per (chunk, batch entry and kv head); its rows are every
        (query head of the group, query) pair."""
        k = self.k
        if k.schedule != "split_kv" and not k.split_max_queries:
            return None
        group = k.group
        kv_head = cx.index_var(group.kv_dim) if group else None
        program_axes = [
            (kv_head, group.kv_dim)
            if group and kv_head and a.index == group.head.index
            else (cx.index_var(a.index), a.dim)
            for a in k.batch_axes
        ]
        rows = []
        if group:
            rows.append(
                f"const int {cx.index_var(group.head.index)} = {kv_head} * group + r / m_rows;"
            )
        if self.query:
            rows.append(f"const int {cx.index_var(self.query)} = r % m_rows;")
        mapping = group_subscript(k)
        replaced = {mapping: kv_head} if mapping is not None and kv_head else None
        values = self.mode(True, self.decompose(program_axes), rows, "r < n_rows", replaced)
        values.update(
            split_fn=f"attncc_{self.name}_split",
            rows_split_fn=f"attncc_{self.name}_rows_split",
            combine_fn=f"attncc_{self.name}_combine",
        )
        return values

    # -------------------------------------------------------------- host

    def pointer_args(self) -> list[tuple[int, str]]:
        """(position, host expression) of each pointer among the kernel parameters: a launch
        plan rewrites them on every call (the host expressions name the tensor)."""
        return [
            (i, arg.host) for i, arg in enumerate(plan.launch_args(self.k)) if arg.type == "pointer"
        ]

    def pointer_sources(self) -> list[str]:
        """Where each pointer of ``pointer_args`` comes from, as a Python literal: an input
        by name, ``("output", 0)`` for the output or ``("output", 1)`` for the lse."""
        outputs = {"output": 0, "lse": 1}
        sources = []
        for arg in plan.launch_args(self.k):
            if arg.type != "pointer":
                continue
            if arg.source in outputs:
                sources.append(repr(("output", outputs[arg.source])))
            else:
                assert arg.tensor is not None
                sources.append(repr(("input", arg.tensor.name)))
        return sources

    def kernel_params(self) -> tuple[list[str], list[str]]:
        """C++ parameter declarations and the host expressions passed for them."""
        decls: list[str] = []
        host_args: list[str] = []
        for arg in plan.launch_args(self.k):
            if arg.type == "pointer":
                if arg.source == "output":
                    # FP8 inputs write bfloat16 (the hosts' _OUTPUT_DTYPES)
                    ctype = f"{'bf16_t' if self.k.fp8 else 'elem_t'}* __restrict__"
                elif arg.source == "lse":
                    ctype = "float* __restrict__"
                else:
                    assert arg.tensor is not None
                    ctype = cu.pointer_type(arg.tensor)
                decls.append(f"{ctype} {arg.var}")
                host_args.append(f"_ptr({arg.host})")
            else:
                decls.append(f"{arg.type} {arg.var}")
                host_args.append(f"_{'f32' if arg.type == 'float' else 'i32'}({arg.host})")
        return decls, host_args

    def col_axis(self, operand: ir.Operand, col: str) -> int:
        """The axis of ``operand`` read by the head dim ``col`` (16-byte loads need it
        contiguous), or -1 when no plain subscript reads it."""
        for part in plan.operand_parts(operand, None, col):
            if part.kind == "col":
                return part.axis
        return -1

    def tma_axes(self) -> dict[str, list[Any]] | None:
        """K's and V's [tensor, key axis, head-dim axis] for the fused kernel's tensor copies
        (TMA), or None where a tensor map cannot describe their tiles: a key read through a
        page table or an expression, or key bounds read from a tensor (keys outside them
        must load as zeros, and a map zero-fills only past the key axis's end)."""
        k = self.k
        assert k.mask_plan is not None
        if plan.bounds_read_tensors(k.mask_plan):
            return None
        axes: dict[str, list[Any]] = {}
        for name, operand, col in (
            ("k", k.key, k.head_axis.index),
            ("v", k.value, k.value_axis.index),
        ):
            # one part an axis, in axis order
            kinds = [part.kind for part in plan.operand_parts(operand, None, col, self.key)]
            if kinds.count("key") != 1 or kinds.count("col") != 1 or "gather" in kinds:
                return None
            axes[name] = [operand.tensor, kinds.index("key"), kinds.index("col")]
        return axes

    def families(self) -> list[str]:
        """The kernel families this spec's host module may launch (FAMILIES), the one the
        default call runs first: the fused kernel's sm_90a variant, or split-KV where every
        call splits the keys; FP8 inputs the sm_90a variant alone (the others' tiles are
        16-bit)."""
        if self.k.fp8:
            return ["hopper"]
        if self.k.schedule == "split_kv":
            return ["split", "fma"]
        families = ["hopper", "mma", "fma"] + (["split"] if self.split_mode() is not None else [])
        return families + (["backward"] if self.has_backward() else [])

    def walks_heads(self) -> bool:
        """Whether the sm_90a backward's block may walk a GQA group's query heads (the host's
        _backward_group): the group's heads are the innermost batch axis (consecutive
        programs), its key tile's bounds, computed once for all of them, do not read the
        head (the scale cannot: a scalar factor), and there is no tile index (a block's live
        query tiles are its program's)."""
        k = self.k
        assert k.mask_plan is not None
        if k.group is None or not k.batch_axes or k.group.head != k.batch_axes[-1]:
            return False
        bounds = [b.expr for b in (*k.mask_plan.lower, *k.mask_plan.upper)]
        reads = set().union(*(indices_of(e) for e in bounds))
        return k.group.head.index not in reads and k.tile_index is None

    def has_backward(self) -> bool:
        """Whether the sm_90a backward (family_backward.cu.jinja) renders for this spec: score
        modifications with a derivative for the score (the chain rule runs in the kernel;
        gradients of the side inputs they read come from the Triton backward: the runtime
        takes it for such calls), no sink, no value scale, no FP8, a query axis, and key
        bounds that read no tensor (cache lengths: the kernel reads every key of its tile,
        and past such a bound the cache may hold NaN, which dP would carry into dS). Other
        specs' gradients come from the Triton backward (attncc.codegen.backward)."""
        k = self.k
        assert k.mask_plan is not None
        try:
            score_chain(k.score_mods)
        except NoDerivative:
            return False
        plain = k.sink is None and not plan.bounds_read_tensors(k.mask_plan)
        return plain and k.value_scale is None and not k.fp8 and k.query_axis is not None

    def contents(self, family: str, tile_index: bool, split: dict[str, Any] | None) -> list[str]:
        """Comment lines saying what one family's source holds and how the host compiles it
        (which ATTNCC_* macros, set per call by the host module's _defines, select what)."""
        name = self.name
        others = ", ".join(f for f in self.families() if f != family)
        lines = [f"Kernel family '{family}' ({FAMILIES[family]}); the spec's other families:"]
        lines.append(f"{others} (attncc compile --target cuda -o DIR writes every one).")
        lines.append("The host module compiles it with NVRTC per call shape, its ATTNCC_* macros")
        lines.append("set per call (the defaults below compile standalone). It holds:")
        if family == "hopper":
            lines += [
                f"  attncc_{name}_fwd: fused attention, sm_90a warp-group MMAs, a copying warp",
                "    group feeding one to three MMA groups, persistent blocks (hopper.cu.jinja)",
            ]
            if tile_index:
                lines.append(
                    f"  attncc_{name}_tile_index: the key-tile index the fused kernel walks"
                )
        elif family == "mma":
            lines += [
                f"  attncc_{name}_fwd: fused attention, a block a query tile; its key loop on",
                "    mma.sync (ATTNCC_WGMMA 0) or sm_90a warp-group MMAs (ATTNCC_WGMMA 1)",
            ]
        elif family == "fma":
            if self.k.schedule != "split_kv":
                lines.append(f"  attncc_{name}_rows: fused attention, a warp a query row")
            if split is not None:
                lines.append(f"  {split['rows_split_fn']}: split-KV, a warp a (chunk, row)")
                lines.append(f"  {split['combine_fn']}: the merge of the chunks")
        elif family == "backward":
            lines += [
                f"  attncc_{name}_bwd: dQ, dK and dV, sm_90a warp-group MMAs, a block a key",
                "    tile (FlashAttention-3's one pass, dQ added in float32; backward.cu.jinja)",
            ]
        elif split is not None:
            lines.append(f"  {split['split_fn']}: split-KV, chunks merged in-kernel")
        lines.append("Shared device helpers are in the headers it includes (attncc_*.cuh).")
        return lines

    def values(self) -> dict[str, Any]:
        k = self.k
        decls, host_args = self.kernel_params()
        _, _, o_col = self.output_offsets()
        split = self.split_mode()
        fused = self.fused_mode()
        backward = self.has_backward()
        query = k.query_axis
        group = k.group
        return {
            "header": host.header(k, self.source_text),
            "name": self.name,
            "entry": templating.entry_name(k.name),
            "doc": host.doc(k),
            "fused_fn": f"attncc_{self.name}_fwd",
            "backward_fn": f"attncc_{self.name}_bwd" if backward else None,
            "delta_fn": f"attncc_{self.name}_bwd_delta" if backward else None,
            "dq_fn": f"attncc_{self.name}_bwd_dq" if backward else None,
            "backward_chain": self.backward_chain(self.env(False)) if backward else None,
            "walks_heads": backward and self.walks_heads(),
            "row_ranges_fn": (
                f"attncc_{self.name}_bwd_row_ranges" if backward and fused["tile_index"] else None
            ),
            "rows_fn": None if k.schedule == "split_kv" else f"attncc_{self.name}_rows",
            "fused": fused,
            "tile_index_masks": len(fused["tile_index"]["masks"]) if fused["tile_index"] else 0,
            "partial_tiles_read_keys": int(fused["keys_early"]),
            "index_fn": fused["tile_index"]["build_fn"] if fused["tile_index"] else None,
            "index_programs_host": (
                fused["tile_index"]["programs_host"] if fused["tile_index"] else "1"
            ),
            "split": split,
            "kernel_params": decls,
            "launch_args": host_args,
            "pointer_slots": [i for i, _ in self.pointer_args()],
            "pointer_hosts": [host for _, host in self.pointer_args()],
            "pointer_sources": self.pointer_sources(),
            "key_var": self.key_var,
            "key_size": cx.dim_var(k.key_axis.dim),
            "q_name": k.query.tensor,
            "k_name": k.key.tensor,
            "v_name": k.value.tensor,
            "o_name": k.output.name,
            "head_dim": cx.dim_var(k.head_axis.dim),
            "value_dim": cx.dim_var(k.value_axis.dim),
            "o_col": o_col,
            # host side
            "head_dim_name": k.head_axis.dim,
            "value_dim_name": k.value_axis.dim,
            "rows_host": f"sizes[{query.dim!r}]" if query else "1",
            "batch_programs": " * ".join(f"sizes[{a.dim!r}]" for a in k.batch_axes) or "1",
            "host_key_size": f"sizes[{k.key_axis.dim!r}]",
            "vec_axes": {
                "q": [k.query.tensor, self.col_axis(k.query, k.head_axis.index)],
                "k": [k.key.tensor, self.col_axis(k.key, k.head_axis.index)],
                "v": [k.value.tensor, self.col_axis(k.value, k.value_axis.index)],
            },
            "tma_axes": self.tma_axes(),
            "row_bounded_keys": bool(
                k.mask_plan and any(b.slope for b in (*k.mask_plan.lower, *k.mask_plan.upper))
            ),
            "keys_grow_with_row": plan.keys_grow_with_row(k),
            "calls_tanh": "tanh" in plan.functions_used(k),
            "split_programs_host": " * ".join(
                f"sizes[{(group.kv_dim if group and a.index == group.head.index else a.dim)!r}]"
                for a in k.batch_axes
            )
            or "1",
            "group_host": f"sizes[{group.head.dim!r}] // sizes[{group.kv_dim!r}]" if group else "1",
            "max_queries": k.split_max_queries,
            "split_only": k.schedule == "split_kv",
            "fast_division": bool(plan.divisor_dims(k)),
            "padded_head_dims": list(PADDED_HEAD_DIMS),
            "fp8": k.fp8,
            "default_elem": "f8e4m3_t" if k.fp8 else "bf16_t",
            # the key blocks' sizes (host expressions): each a multiple of the key tile
            "key_block_sizes": [
                cx.host_expr(block.right, dims="sizes", params="params")
                for block in self.key_blocks()
                if isinstance(block, ir.BinOp)
            ],
            "output": {
                "dims": list(k.output.dims),
                "lse_dims": [a.dim for a in k.batch_axes] + ([query.dim] if query else []),
                "lse_permutation": list(plan.lse_permutation(k)),
            },
            **host.tables(k),
        }


def render_wgmma_probe() -> str:
    """The CUDA source of the Hopper primitives' probe kernel ``attncc_wgmma_probe``
    (templates/cuda/wgmma_probe.cu.jinja; compile for sm_90a)."""
    return str(
        environment()
        .get_template("wgmma_probe.cu.jinja")
        .render(wgmma=cuda_wgmma.instructions(), uses_tanh=False, fast_division=False)
    )


def unsupported(kernel: ir.AttentionKernel) -> str | None:
    """Why target cuda cannot render ``kernel``, as the one-line error ``render`` raises
    (naming what to use instead), or None. Target "auto" takes Triton for such kernels."""
    name = f"attncc {kernel.name}: "
    if kernel.schedule == "naive":
        return (
            f"{name}schedule 'naive' is not available for target cuda (use schedule 'fused' "
            "or 'split_kv', or target 'triton')"
        )
    if kernel.value_scale is not None and not kernel.fp8:
        # only the FP8 kernel weighs P·V by a value scale (a tile at a time)
        return (
            f"{name}target cuda has value scales with FP8 inputs only (use target 'triton' "
            "or 'auto')"
        )
    if kernel.value_scale is not None and plan.reads_index_outside(
        kernel.value_scale, kernel.key_axis.index, plan.key_blocks(kernel)
    ):
        # the kernel weighs a tile's P·V by one value scale (its keys share their block)
        return (
            f"{name}target cuda takes a value scale read by key blocks (v_descale[b, h, n / "
            "block_n]), not by the key itself (use target 'triton' or 'auto')"
        )
    if kernel.fp8 and kernel.schedule != "fused":
        return (
            f"{name}target cuda runs FP8 inputs with schedule 'fused' only (use target "
            "'triton' or 'auto')"
        )
    if kernel.sink is not None:
        # the kernels' softmax has no sink term: rendering them would leave the sink out
        return f"{name}target cuda has no softmax sink yet (use target 'triton' or 'auto')"
    return None


def render(kernel: ir.AttentionKernel, spec: ast.Spec | str = "") -> Rendered:
    """The CUDA source and the host module for ``kernel``; the entry is attncc_<spec name>.
    ``spec`` is the parsed spec (its statements' lines go into comments beside the code that
    implements them), or only its text (no statement comments)."""
    reason = unsupported(kernel)
    if reason is not None:
        raise ValueError(reason)
    context = _Context(kernel, spec)
    values = context.values()
    env = environment()
    tile_index = values["fused"]["tile_index"] is not None
    sources = tuple(
        (
            family,
            env.get_template(f"family_{family}.cu.jinja").render(
                contents=context.contents(family, tile_index, values["split"]),
                includes=_FAMILY_HEADERS[family],
                **values,
            ),
        )
        for family in context.families()
    )
    shipped = headers()
    host_module = env.get_template("host.py.jinja").render(
        cuda_sources=sources, cuda_headers=shipped, **values
    )
    return Rendered(sources[0][1], host_module, values["entry"], sources, shipped)
