"""The attention IR: frozen dataclasses, edited with ``dataclasses.replace``.

An ``AttentionKernel`` is attention recognised in a spec: which tensors play query, key and
value, how each is indexed, the scalar scale of the scores, the elementwise score
modifications, the masks and the output layout. Passes fill in the schedule, the tiling and
the mask plan. Expressions are small typed trees; lets are already inlined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Type = Literal["int", "float", "bool"]

# ----------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Const:
    value: int | float | bool
    type: Type


@dataclass(frozen=True, slots=True)
class Index:
    """The integer value of a loop index (b, h, m, n, ...)."""

    name: str
    type: Type = "int"


@dataclass(frozen=True, slots=True)
class Dim:
    """A size bound from tensor shapes at call time."""

    name: str
    type: Type = "int"


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: Type


@dataclass(frozen=True, slots=True)
class Score:
    """The current score value inside a score modification."""

    type: Type = "float"


@dataclass(frozen=True, slots=True)
class Load:
    """An element of an auxiliary input tensor; ``indices`` has one expression per dim."""

    tensor: str
    indices: tuple[Expr, ...]
    type: Type


@dataclass(frozen=True, slots=True)
class Unary:
    op: Literal["neg", "not"]
    operand: Expr
    type: Type


@dataclass(frozen=True, slots=True)
class BinOp:
    """Arithmetic, comparison or logic. ``/`` on ints truncates toward zero."""

    op: str
    left: Expr
    right: Expr
    type: Type


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    type: Type


Expr = Const | Index | Dim | Param | Score | Load | Unary | BinOp | Call

ARITHMETIC_OPS = ("+", "-", "*", "/", "%")
COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
# ``a op b`` is ``b FLIPPED_COMPARE[op] a``
FLIPPED_COMPARE = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
LOGIC_OPS = ("and", "or")

# ----------------------------------------------------------------------------- kernel


@dataclass(frozen=True, slots=True)
class TensorArg:
    """A kernel input in declaration order; ``dims`` is also its memory layout."""

    name: str
    dims: tuple[str, ...]
    dtype: str
    role: Literal["query", "key", "value", "aux"]


@dataclass(frozen=True, slots=True)
class ParamArg:
    name: str
    dtype: str
    type: Type
    default: Expr | None


@dataclass(frozen=True, slots=True)
class Axis:
    index: str
    dim: str


@dataclass(frozen=True, slots=True)
class Operand:
    """How query, key or value is read: one index expression per tensor dim."""

    tensor: str
    indices: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Output:
    """The output tensor, laid out in the order of its left-hand indices."""

    name: str
    indices: tuple[str, ...]
    dims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TileConfig:
    """One launch configuration: tile sizes, warps per program, software-pipeline depth, and
    whether K/V tiles are TMA copies where the GPU and the tensors' layout allow (Triton)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False


@dataclass(frozen=True, slots=True)
class Tiling:
    """Default configurations by head dim: the first rule whose ``max_head_dim`` is at least
    the call's head dim applies (0: any). The runtime may replace it with a tuned one."""

    rules: tuple[tuple[int, TileConfig], ...]


@dataclass(frozen=True, slots=True)
class KeyBound:
    """One side of the visible key range of a query row: ``expr`` depends on the query index.

    ``slope`` is the sign of d(expr)/d(m) (+1, 0 or -1): it tells which row of a query tile
    gives the tile's extreme, so a tile's range is the bound at its first or last row.
    """

    expr: Expr
    slope: int


@dataclass(frozen=True, slots=True)
class SeparableMask:
    """A residual mask ``row <op> key``: one side reads the query index (and batch indices),
    the other the key index. A tile whose row values and key values cannot satisfy it is
    skipped whole (e.g. query and key tiles from different documents)."""

    row: Expr
    op: str
    key: Expr
    # the mask as the spec wrote it, where its integer terms were moved between the sides
    # to separate them (the same comparison: integer sums, rearranged)
    written: Expr | None = None

    def is_form_of(self, mask: Expr) -> bool:
        """Whether ``mask`` is this comparison, written either way round or as the spec
        wrote it."""
        return mask == self.written or mask in (
            BinOp(self.op, self.row, self.key, "bool"),
            BinOp(FLIPPED_COMPARE[self.op], self.key, self.row, "bool"),
        )


@dataclass(frozen=True, slots=True)
class MaskPlan:
    """Masks split into a key interval per query row and a residual checked per element.

    Visible keys of row m lie in [max(lower), min(upper)); ``lower``/``upper`` empty mean
    0 and N. ``residual`` masks cannot be expressed as an interval (document ids, ...);
    ``separable`` lists those residual masks that allow skipping whole tiles.
    """

    lower: tuple[KeyBound, ...]
    upper: tuple[KeyBound, ...]
    residual: tuple[Expr, ...]
    separable: tuple[SeparableMask, ...] = ()


@dataclass(frozen=True, slots=True)
class TileIndex:
    """A block-sparse list of key tiles per (``axes`` values, query tile), built by small
    kernels before the attention kernel, for the tile sizes of the launch.

    A key tile is *dead* when it lies outside the key interval of every row of the query
    tile, or some mask of ``masks`` holds for none of its (row, key) pairs: it is not listed.
    It is *full* when every mask holds for every pair: inside every row's interval, each of
    ``masks`` provably true from the tile's row and key value ranges, and no other residual
    mask (``full`` false: some residual mask is not separable, so no tile is full). Full
    tiles run with no mask arithmetic; the other listed tiles are *partial* and apply every
    mask per element.

    ``axes`` are the batch axes that the key bounds and ``masks`` read; programs that differ
    only in the other batch indices (heads, for document ids per sequence) share one index.
    """

    axes: tuple[Axis, ...]
    masks: tuple[SeparableMask, ...]
    full: bool


@dataclass(frozen=True, slots=True)
class GroupMapping:
    """GQA: query head ``head`` reads kv head ``head / (H / KVH)``; checked at call time."""

    head: Axis
    kv_dim: str


Schedule = Literal["naive", "fused", "split_kv"]


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    name: str
    dims: tuple[str, ...]
    tensors: tuple[TensorArg, ...]
    params: tuple[ParamArg, ...]
    batch_axes: tuple[Axis, ...]
    query_axis: Axis | None
    key_axis: Axis
    head_axis: Axis
    value_axis: Axis
    query: Operand
    key: Operand
    value: Operand
    score_scale: Expr
    score_mods: tuple[Expr, ...]
    masks: tuple[Expr, ...]
    output: Output
    schedule: Schedule | None = None
    # sizes computed from other dims (``dims N = NP * PAGE``), in declaration order
    derived_dims: tuple[tuple[str, Expr], ...] = ()
    # fused kernels hand calls with at most this many queries to the split-KV kernels (0: never)
    split_max_queries: int = 0
    tiling: Tiling | None = None
    mask_plan: MaskPlan | None = None
    group: GroupMapping | None = None
    tile_index: TileIndex | None = None
    # the returned log-sum-exp's axes (the scores' indices without the softmax's, in the
    # scores' order); kernels write it as batch axes then the query axis and return a view
    lse_order: tuple[str, ...] = ()
    # ``softmax(s, n, sink)``: a logit per row added to the softmax's normaliser only
    # (gpt-oss's attention sinks); it reads batch indices only
    sink: Expr | None = None
    # the output's factors beside p and v (``o = p * v * v_descale[b, h, n / 128]``): one
    # number per key and batch index that weighs each key's probability in P·V (not in the
    # normaliser); None: 1
    value_scale: Expr | None = None

    @property
    def fp8(self) -> bool:
        """Whether q, k and v are FP8 (the checker makes it all three or none)."""
        return self.tensor(self.query.tensor).dtype in ("f8e4m3",)

    def tensor(self, name: str) -> TensorArg:
        for arg in self.tensors:
            if arg.name == name:
                return arg
        raise KeyError(name)

    @property
    def axes(self) -> tuple[Axis, ...]:
        query = (self.query_axis,) if self.query_axis else ()
        return (*self.batch_axes, *query, self.key_axis, self.head_axis, self.value_axis)
