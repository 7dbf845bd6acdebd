"""FP8 (e4m3) quantisation of attention inputs, and the eager emulation of an FP8 kernel.

``quantize(q, k, v, block=(block_m, block_n), hadamard=True)`` turns float query, key and
value tensors ``[..., S, D]`` (rows on the second-to-last axis, the head dim last) into
``torch.float8_e4m3fn`` tensors and float32 *descale* factors, one per tensor
(``block=None``) or one per block of rows: ``block_m`` query rows, ``block_n`` key/value rows
(the kernel's tiles), per leading index (batch, head). ``x ≈ x_fp8.float() * descale`` for
each block; a block's descale is its absolute maximum over 448, the largest e4m3 value, so
the largest element of every block lands on the top of the FP8 range.

``hadamard=True`` first rotates the head dim of Q and K by the normalised Walsh-Hadamard
matrix ``H / sqrt(D)`` (orthogonal and symmetric), which leaves ``Q K^T`` unchanged:
``(Q H)(K H)^T = Q H H^T K^T = Q K^T``. The rotation spreads an outlier entry over the whole
head dim, so a block's maximum (and with it the rounding step of every other entry) shrinks;
this is FlashAttention-3's "incoherent processing". V is not rotated: the rotation would have
to be undone on the output.

``emulate_attention`` computes, in torch on any device, what an FP8 flash kernel computes from
the quantised inputs (see its docstring); ``attncc.checking`` and ``benchmarks/fp8_error.py``
measure kernels and quantisation schemes against it and against the float64 reference.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attncc.codegen import fp8_quantize
from attncc.runtime import triton_plan
from attncc.runtime.jit import interpreter, load_module, module_path, require_interpreter
from attncc.runtime.launch_plan import Plans

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# A block of zeros gets descale 1 rather than 0: its FP8 values are 0 either way, and a zero
# descale would turn a later 0 * inf into NaN.
_ZERO_BLOCK_DESCALE = 1.0


@dataclass(frozen=True, slots=True)
class Fp8Scheme:
    """What a kernel must know about quantised inputs to undo the quantisation.

    ``block_m``/``block_n`` are the query and key/value rows per descale factor (None: one
    descale per tensor, a 0-d tensor); the kernel's tiles must be multiples of them, or, for
    the kernel to apply one descale per tile, equal to them. ``hadamard``: Q and K were
    rotated over the head dim (nothing for the kernel to do; the output is unrotated).
    """

    block_m: int | None
    block_n: int | None
    hadamard: bool
    dtype: str = "f8e4m3"

    @property
    def per_tensor(self) -> bool:
        return self.block_m is None


@dataclass(frozen=True)
class Fp8Inputs:
    """FP8 query, key and value with their float32 descales.

    Per block, ``q_descale`` has shape ``q.shape[:-2] + (ceil(M / block_m),)`` and
    ``k_descale``/``v_descale`` ``k.shape[:-2] + (ceil(N / block_n),)``; per tensor, all three
    are 0-d.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    scheme: Fp8Scheme


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """``x @ (H / sqrt(D))`` over the last axis, ``H`` the Sylvester Hadamard matrix of order D.

    A log2(D)-stage butterfly (O(D log D) per row, no matrix built); D must be a power of two.
    The transform is its own inverse. Computed in ``x``'s dtype (float32 or float64).
    """
    d = x.shape[-1]
    _check_hadamard_dim(d)
    y = x.reshape(-1, d)
    h = 1
    while h < d:
        # pairs (i, i + h) within each group of 2h: (a, b) -> (a + b, a - b)
        pairs = y.reshape(-1, d // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, d)
        h *= 2
    return (y * (1.0 / math.sqrt(d))).reshape(x.shape)


def _check_hadamard_dim(d: int) -> None:
    if d < 1 or d & (d - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head dim, got D={d}")


def _block_amax(x: torch.Tensor, rows: int | None) -> torch.Tensor:
    """The absolute maximum of ``x [..., S, D]`` per block of ``rows`` rows (the last block may
    be short), NaN entries skipped (as the GPU's max.f32 skips them), shape
    ``[..., ceil(S / rows)]``; a 0-d tensor for ``rows=None``."""
    magnitude = x.abs()
    magnitude = torch.where(magnitude.isnan(), torch.zeros_like(magnitude), magnitude)
    if rows is None:
        return magnitude.amax()
    s = x.shape[-2]
    blocks = -(-s // rows)
    row_max = magnitude.amax(dim=-1)  # [..., S]
    pad = blocks * rows - s
    if pad:
        row_max = torch.nn.functional.pad(row_max, (0, pad))  # zeros never raise a max
    return row_max.reshape(*row_max.shape[:-1], blocks, rows).amax(dim=-1)


def _per_row(descale: torch.Tensor, rows: int | None, s: int) -> torch.Tensor:
    """Expand a block descale ``[..., blocks]`` to ``[..., S, 1]`` (0-d stays 0-d)."""
    if rows is None:
        return descale
    return descale.repeat_interleave(rows, dim=-1)[..., :s].unsqueeze(-1)


def _quantize_one(x: torch.Tensor, rows: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.to(torch.float32) if x.dtype != torch.float64 else x
    amax = _block_amax(x, rows)
    # tensor divisions: PyTorch's CUDA kernels divide by a Python number as a multiplication
    # by its reciprocal, one rounding away from the IEEE quotient the CPU (and the kernel,
    # div_rn) computes
    fp8_max = torch.full_like(amax, FP8_MAX)
    nonzero = amax > 0
    descale = torch.where(nonzero, amax / fp8_max, torch.full_like(amax, _ZERO_BLOCK_DESCALE))
    # a product with the scale, not a division by the descale: a division a value made the
    # kernel's row-major pass 2.2x slower on an H200 (39.2 against 18.0 us at 16 x 8192 x 128)
    scale = torch.where(nonzero, fp8_max / amax, torch.full_like(amax, 1 / _ZERO_BLOCK_DESCALE))
    scaled = x * _per_row(scale, rows, x.shape[-2])
    # The product may land a hair above 448; e4m3fn has no infinity and would give NaN.
    x8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x8, descale.to(torch.float32)


def _check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: tuple[int, int] | None
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{name}: expected a tensor [..., S, D], got shape {tuple(t.shape)}")
        if not t.is_floating_point() or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise TypeError(
                f"{name}: expected a float16/bfloat16/float32/float64 tensor, got {t.dtype}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: head dim {k.shape[-1]} differs from q's {q.shape[-1]}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, q on {q.device}; all three on one device")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"v: shape {tuple(v.shape)} does not match k's {tuple(k.shape)} before the head dim"
        )
    if block is not None and (
        len(block) != 2 or any(not isinstance(b, int) or b < 1 for b in block)
    ):
        raise ValueError(f"block: expected (block_m, block_n), two positive ints, got {block!r}")


def quantize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: tuple[int, int] | None = None,
    hadamard: bool = False,
) -> Fp8Inputs:
    """Quantise ``q [..., M, D]``, ``k [..., N, D]``, ``v [..., N, Dv]`` to FP8 e4m3.

    ``block=(block_m, block_n)``: one descale per ``block_m`` query rows and per ``block_n``
    key/value rows of each leading index (batch, head); ``None``: one per tensor.
    ``hadamard=True`` rotates the head dim of q and k first (see the module docstring).
    The arithmetic is float32 (float64 for float64 inputs).

    Per block, CUDA tensors (and CPU tensors while ``TRITON_INTERPRET=1``) go through one
    Triton kernel per tensor that reads it once (templates/triton/fp8_quantize.py.jinja);
    its numbers are ``quantize_torch``'s, bit for bit without the rotation, and with it up
    to the order of the rotation's float32 sums. The FP8 q and k it returns are contiguous;
    v is key-major (a ``[..., N, Dv]`` view of ``[..., Dv, N]`` storage): FP8 tensor cores
    take P·V's second operand with its reduction axis (the keys) contiguous, and kernels
    given a row-major v multiply P·V in bfloat16 instead.
    Per tensor, float64 inputs and blocks too large for one program's registers (padded
    rows x head dim > 32768) take the torch path.
    """
    on_device = q.is_cuda or (q.device.type == "cpu" and _interpreting())
    if block is not None and on_device and q.dim() == k.dim() == v.dim() == 4:
        replayed = _replayed(q, k, v, block, hadamard)
        if replayed is not None:
            return replayed
    return _quantize(q, k, v, block, hadamard, kernel=True)


def _replayed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: tuple[int, int], hadamard: bool
) -> Fp8Inputs | None:
    """A repeated call's replay of the plan its geometry recorded (``_quantize_kernel``), or
    None. The checks are not repeated: the plan's key holds everything they read (shapes,
    strides, dtypes, devices, the block and the rotation), and a plan is recorded only after
    they passed. A replayed call took 100-102 us of CPU against the full path's 142-143 (one
    process on an H200 host, three 16 x 8192 x 128 tensors)."""
    # the key from the jobs' layouts alone, no _Job built (5 of a replay's ~65 us of CPU)
    specs = _job_specs(block[0], block[1], hadamard)
    tensors = {"q": q, "k": k, "v": v}
    plan = _PLANS.get(Plans.key(tensors, _key_params(specs), False, False))
    if plan is None:
        return None
    # on the GPU the C launcher's replay of the plan (its allocations and three launches in
    # one C call) where it has one, else the plan's own
    replay = plan.native_replay() if q.is_cuda else None
    result = replay(tensors) if replay is not None else None
    if result is None:
        with interpreter(not q.is_cuda):
            result = plan(tensors)
    if result is None:
        return None
    q8, k8, v8 = (
        _fp8_view(codes, key_major)
        for codes, (_, _, _, key_major) in zip(result[0::2], specs, strict=True)
    )
    scheme = Fp8Scheme(block[0], block[1], hadamard)
    return Fp8Inputs(q8, k8, v8, result[1], result[3], result[5], scheme)


def quantize_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: tuple[int, int] | None = None,
    hadamard: bool = False,
) -> Fp8Inputs:
    """``quantize`` in torch eager ops on any device (the definition the kernel matches)."""
    return _quantize(q, k, v, block, hadamard, kernel=False)


def _quantize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: tuple[int, int] | None,
    hadamard: bool,
    kernel: bool,
) -> Fp8Inputs:
    _check_inputs(q, k, v, block)
    if hadamard:
        _check_hadamard_dim(q.shape[-1])
    block_m, block_n = block if block is not None else (None, None)
    jobs = _jobs(q, k, v, block_m, block_n, hadamard)
    on_kernel = {n: j for n, j in jobs.items() if kernel and _kernel_takes(j.x, j.rows, j.rotate)}
    done = _quantize_kernel(on_kernel) if on_kernel else {}
    for name, job in jobs.items():
        if name not in done:
            done[name] = _quantize_eager(job)
    (q8, q_descale), (k8, k_descale), (v8, v_descale) = done["q"], done["k"], done["v"]
    return Fp8Inputs(
        q8, k8, v8, q_descale, k_descale, v_descale, Fp8Scheme(block_m, block_n, hadamard)
    )


# a job's layout: (tensor name, rows a block or None, rotated, written key-major)
_JobSpec = tuple[str, int | None, bool, bool]


def _job_specs(block_m: int | None, block_n: int | None, hadamard: bool) -> tuple[_JobSpec, ...]:
    """q, k and v's jobs: q in blocks of ``block_m`` rows, k and v of ``block_n``; q and k
    rotated where ``hadamard``; v written key-major."""
    return (
        ("q", block_m, hadamard, False),
        ("k", block_n, hadamard, False),
        ("v", block_n, False, True),
    )


def _jobs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int | None,
    block_n: int | None,
    hadamard: bool,
) -> dict[str, _Job]:
    x = {"q": q, "k": k, "v": v}
    return {
        name: _Job(x[name], rows, rotate, key_major)
        for name, rows, rotate, key_major in _job_specs(block_m, block_n, hadamard)
    }


@dataclass(frozen=True)
class _Job:
    """One tensor's quantisation: ``rows`` a block (None: per tensor), rotated or not,
    written key-major or row-major."""

    x: torch.Tensor
    rows: int | None
    rotate: bool
    key_major: bool


def _quantize_eager(job: _Job) -> tuple[torch.Tensor, torch.Tensor]:
    x = job.x
    if job.rotate:
        x = hadamard_transform(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32))
    x8, descale = _quantize_one(x, job.rows)
    if job.key_major:
        x8 = _empty_fp8(x8.shape, True, x8.device).copy_(x8)
    return x8, descale


def _empty_fp8(shape: torch.Size, key_major: bool, device: torch.device) -> torch.Tensor:
    """An FP8 tensor of ``shape [..., S, D]``: contiguous, or key-major (a view of
    ``[..., D, S]`` storage: stride 1 along S)."""
    if not key_major:
        return torch.empty(shape, dtype=FP8_DTYPE, device=device)
    storage = torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=FP8_DTYPE, device=device)
    return storage.transpose(-1, -2)


# One program holds a whole block (padded rows x padded head dim) in registers, as float32:
# 128 x 128 is 64 KiB over 8 warps; past 32768 elements it would spill.
_KERNEL_MAX_ELEMENTS = 32768
# shared memory a block may take where the device does not say (an H100/H200's 227 KiB)
_DEFAULT_MAX_SHARED = 232448
# the rotation's loads in flight (Triton's software pipelining of the block loop), at most
_MAX_ROTATION_STAGES = 3
# tl.dot's smallest tile side; also the smallest padding of the kernel's block
_MIN_TILE = 16


def _padded(n: int) -> int:
    return max(_MIN_TILE, 1 << (n - 1).bit_length())


def _kernel_takes(x: torch.Tensor, rows: int | None, rotate: bool) -> bool:
    """Whether the Triton kernel quantises ``x``: blocks of ``rows`` (not per tensor), on
    CUDA, or on the CPU while Triton's interpreter is on; float16/bfloat16/float32; not empty;
    a block that fits, and with the rotation, a product whose operands fit in shared memory."""
    if rows is None:
        return False
    on_device = x.device.type == "cuda" or (x.device.type == "cpu" and _interpreting())
    d_pad = _padded(x.shape[-1])
    return (
        on_device
        and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and x.numel() > 0
        and _padded(rows) * d_pad <= _KERNEL_MAX_ELEMENTS
        and (not rotate or _rotation_stages(x, rows) > 0)
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _rotation_stages(x: torch.Tensor, rows: int) -> int:
    """How many blocks of ``x`` the rotating kernel may load ahead (0: it does not fit).

    Its shared memory is the D x D signs, one block a stage (tl.dot's operand) and the
    block's FP8 codes (their layout change before the store), as Triton counts it: 352 KiB
    for 16-bit inputs at D=256 and 3 stages, past an H100/H200's 227 (OutOfResources)."""
    d_pad = _padded(x.shape[-1])
    block = _padded(rows) * d_pad * x.element_size()
    fixed = d_pad * d_pad * x.element_size() + _padded(rows) * d_pad
    return max(0, min(_MAX_ROTATION_STAGES, (_max_shared(x.device) - fixed) // block))


@functools.cache
def _max_shared(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_MAX_SHARED
    properties = torch.cuda.get_device_properties(device)
    return int(getattr(properties, "shared_memory_per_block_optin", _DEFAULT_MAX_SHARED))


@functools.cache
def _kernel_path() -> Path:
    return module_path("fp8_quantize", fp8_quantize.render(FP8_MAX, _ZERO_BLOCK_DESCALE))


def _kernel_module(interpreted: bool) -> ModuleType:
    return load_module(_kernel_path(), interpreted)


_SIGNS: dict[tuple[int, int, torch.device, torch.dtype], torch.Tensor] = {}


def _hadamard_signs(d: int, d_pad: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order ``d`` (entries +-1, exact in every float
    dtype), zero-padded to ``[d_pad, d_pad]``; built once per (d, device, dtype)."""
    key = (d, d_pad, device, dtype)
    signs = _SIGNS.get(key)
    if signs is None:
        h = torch.ones(1, 1, dtype=torch.float32)
        while h.shape[0] < d:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        padded = torch.zeros(d_pad, d_pad, dtype=torch.float32)
        padded[:d, :d] = h
        signs = _SIGNS[key] = padded.to(device=device, dtype=dtype)
    return signs


# programs of a rotating quantisation under the interpreter: fewer than blocks in the tests
_INTERPRETED_PROGRAMS = 3


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _quantize_kernel(jobs: dict[str, _Job]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``_quantize_one`` of each job (after the rotation, where it rotates), one Triton
    launch a tensor, written key-major or row-major (contiguous); by name, its FP8 tensor
    and descales.

    The first call of a geometry (``Plans.key``: each tensor's shape, strides, dtype, device
    and alignment, with the blocks, rotations and layouts) is recorded and later ones replay
    it (attncc.runtime.triton_plan): Triton's launcher took 184 us of CPU a ``quantize``
    call of three tensors on an H200, against the kernels' 58 us of GPU time."""
    # the kernel walks two leading axes by their strides (batch, heads): any [B, H, S, D]
    # layout is read in place; more leading axes are merged (a copy where strides forbid)
    tensors = {name: _four_dims(job.x.detach()) for name, job in jobs.items()}
    first = next(iter(jobs.values())).x
    interpreted = first.device.type == "cpu"
    if interpreted:
        require_interpreter()
    key = _plan_key(tensors, jobs)
    plan = _PLANS.get(key)
    switch = first.is_cuda and first.device.index != torch.cuda.current_device()
    device = torch.cuda.device(first.device) if switch else contextlib.nullcontext()
    with interpreter(interpreted), device:
        result = plan(tensors) if plan is not None else None
        if result is None:
            module = _kernel_module(interpreted)
            signs = {
                name: _hadamard_signs(
                    job.x.shape[-1], _padded(job.x.shape[-1]), job.x.device, job.x.dtype
                )
                for name, job in jobs.items()
                if job.rotate
            }

            def launch() -> tuple[torch.Tensor, ...]:
                out: list[torch.Tensor] = []
                for name, job in jobs.items():
                    x4 = tensors[name]
                    out += _launch(module, x4, signs.get(name, x4), job, job.x.shape[:-2])
                return tuple(out)

            if key is None or plan is not None:
                result = launch()
            else:
                result, plan, _ = triton_plan.record(module, launch, tensors, not interpreted)
                if plan is not None:
                    _PLANS.remember(key, plan)
    return _outputs(jobs, result)


def _plan_key(tensors: dict[str, torch.Tensor], jobs: dict[str, _Job]) -> tuple[Any, ...] | None:
    """The key of the jobs' plan: their tensors' geometry (``Plans.key``) and each job's
    block, rotation and layout (``_key_params``). The full path and a repeated call's replay
    both look it up."""
    specs = [(name, job.rows, job.rotate, job.key_major) for name, job in jobs.items()]
    return Plans.key(tensors, _key_params(specs), False, False)


def _key_params(specs: Iterable[_JobSpec]) -> dict[str, Any]:
    """The jobs' layouts as a plan key's params: each job's rows, rotate and key_major."""
    params: dict[str, Any] = {}
    for name, rows, rotate, key_major in specs:
        params[f"{name}.rows"] = rows
        params[f"{name}.rotate"] = rotate
        params[f"{name}.key_major"] = key_major
    return params


def _outputs(
    jobs: dict[str, _Job], result: tuple[torch.Tensor, ...]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """By name, the FP8 tensor and descales of each job from the launches' (codes, descale)
    pairs, in the jobs' order."""
    done = {}
    for at, (name, job) in enumerate(jobs.items()):
        done[name] = _fp8_view(result[2 * at], job.key_major), result[2 * at + 1]
    return done


def _fp8_view(codes: torch.Tensor, key_major: bool) -> torch.Tensor:
    """A launch's e4m3 codes (bytes) as the FP8 tensor ``[..., S, D]`` (key-major codes are
    ``[..., D, S]``)."""
    x8 = codes.view(FP8_DTYPE)
    return x8.transpose(-1, -2) if key_major else x8


def _four_dims(x: torch.Tensor) -> torch.Tensor:
    """``x [..., S, D]`` as ``[B, H, S, D]``: leading axes merged or added (a copy where
    strides forbid merging)."""
    lead = x.dim() - 2
    if lead == 2:
        return x
    return x.reshape(-1, *x.shape[-3:]) if lead > 2 else x[(None,) * (2 - lead)]


_PLANS = Plans()


def _launch(
    module: ModuleType,
    x4: torch.Tensor,
    signs: torch.Tensor,
    job: _Job,
    lead: torch.Size,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate and launch: the e4m3 codes as bytes, ``[*lead, S, D]`` (``[*lead, D, S]``
    key-major), and the descales ``[*lead, blocks]``. Nothing but allocations and the
    launch, so triton_plan can record it."""
    assert job.rows is not None
    b, h, s, d = x4.shape
    blocks = -(-s // job.rows)
    total = b * h * blocks
    interpreted = x4.device.type == "cpu"
    # With the rotation, one program per SM walks the blocks (the signs are loaded once a
    # program; on the CPU a few, so the interpreter walks that loop too); without it, one
    # program a block.
    if job.rotate:
        programs = min(total, _INTERPRETED_PROGRAMS if interpreted else _sm_count(x4.device))
    else:
        programs = total
    shape = (*lead, d, s) if job.key_major else (*lead, s, d)
    codes = torch.empty(shape, dtype=torch.uint8, device=x4.device)
    descale = torch.empty((*lead, blocks), dtype=torch.float32, device=x4.device)
    block_pad, d_pad = _padded(job.rows), _padded(d)
    module.fp8_quantize_kernel[(programs,)](
        x4,
        codes,
        descale,
        signs,
        1.0 / math.sqrt(d),
        s,
        d,
        h,
        blocks,
        total,
        *x4.stride(),
        BLOCK_ROWS=job.rows,
        BLOCK_PAD=block_pad,
        D_PAD=d_pad,
        HADAMARD=job.rotate,
        # +-1 times float32 is exact only in IEEE float32 (TF32 keeps 10 mantissa bits)
        DOT_PRECISION="ieee" if x4.dtype == torch.float32 else "tf32",
        KEY_MAJOR=job.key_major,
        num_warps=max(4, min(16, block_pad * d_pad // 2048)),
        **({"num_stages": _rotation_stages(x4, job.rows)} if job.rotate else {}),
    )
    return codes, descale


def dequantize(
    x: Fp8Inputs, dtype: torch.dtype = torch.float32, unrotate: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v back in ``dtype``: FP8 values times their descales. With ``unrotate`` (the
    default), q and k are rotated back, so they approximate the tensors given to ``quantize``;
    without it they are in the rotated basis the kernel sees."""
    s = x.scheme
    q = x.q.to(dtype) * _per_row(x.q_descale.to(dtype), s.block_m, x.q.shape[-2])
    k = x.k.to(dtype) * _per_row(x.k_descale.to(dtype), s.block_n, x.k.shape[-2])
    v = x.v.to(dtype) * _per_row(x.v_descale.to(dtype), s.block_n, x.v.shape[-2])
    if s.hadamard and unrotate:
        q, k = hadamard_transform(q), hadamard_transform(k)
    return q, k, v


def emulate_attention(x: Fp8Inputs, scale: float | None = None) -> torch.Tensor:
    """Full (unmasked) attention as an FP8 flash kernel computes it from ``x``, in float32.

    Emulated: scores from the FP8 q and k with float32 accumulation (an e4m3 product is
    exact in float32), times the q and k descales of the row's and column's blocks and
    ``scale``; softmax statistics (row max, row sum) in float32; the probabilities
    ``exp(s - max)`` rounded to FP8 e4m3 before ``P·V`` (FlashAttention-3 feeds P to the
    FP8 tensor core), the row sum taken from the unrounded float32 values; ``P·V`` accumulated
    in float32 per block of keys, times that block's v descale. Not emulated: the online
    softmax's rescaling (P is relative to the final row max, as in a one-tile kernel; a
    running max only moves P's values within e4m3's relative precision) and the reduced
    accumulator precision of Hopper's FP8 wgmma. Heads of q and k must match (expand GQA
    first). Returns ``[..., M, Dv]`` float32.
    """
    s = x.scheme
    f32 = torch.float32
    q = x.q.to(f32)
    k = x.k.to(f32)
    v = x.v.to(f32)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    m, n = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2)
    qd = _per_row(x.q_descale, s.block_m, m)  # [..., M, 1] or 0-d
    kd = _per_row(x.k_descale, s.block_n, n)
    kd = kd if kd.dim() == 0 else kd.transpose(-1, -2)  # [..., 1, N]
    scores = scores * (qd * kd * scale)
    row_max = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - row_max)
    row_sum = p.sum(dim=-1, keepdim=True)
    p8 = p.to(FP8_DTYPE).to(f32)
    if s.block_n is None:
        out = (p8 @ v) * x.v_descale
    else:
        # Scaling v's rows by their block's descale equals scaling each block's partial
        # product, up to float32 rounding (1e-7 relative, far below FP8's 6e-2).
        vd = _per_row(x.v_descale, s.block_n, n)  # [..., N, 1]
        out = p8 @ (v * vd)
    return out / row_sum
