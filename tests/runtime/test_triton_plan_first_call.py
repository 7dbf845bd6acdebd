"""A recorded first call's launches go through attncc's launcher (triton_plan's
``_launched_directly``), so a process never builds Triton's launcher for a kernel whose
launch attncc can pack: on CPU, the decisions, with the launch itself a stand-in. The
compiled path runs on a GPU (tests/gpu/test_gpu_first_call.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from attncc.runtime import driver, triton_plan


class _Launch(driver.Launch):
    def __init__(self) -> None:  # no parameters to pack: run records its arguments
        self.runs: list[tuple[Any, ...]] = []

    def run(self, stream: int, inputs: Any, items: Any, base: int) -> None:
        self.runs.append((stream, inputs, tuple(items), base))


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``_direct`` records what it is given and returns ``seen["answer"]``."""
    seen: dict[str, Any] = {"answer": _Launch()}

    def fake(compiled: Any, device: int, grid: Any, values: Any, types: Any, *rest: Any) -> Any:
        seen.update(device=device, grid=grid, values=list(values), types=list(types))
        return seen["answer"]

    monkeypatch.setattr(triton_plan, "_direct", fake)
    monkeypatch.setattr(triton_plan, "_launch_hooks", lambda: False)
    monkeypatch.setattr(
        torch._C, "_cuda_getCurrentRawStream", lambda device: 77 + device, raising=False
    )
    return seen


KERNEL = SimpleNamespace(arg_names=["q", "n", "BLOCK"])
COMPILED = SimpleNamespace(
    src=SimpleNamespace(signature={"q": "*fp16", "n": "i32", "BLOCK": "constexpr"}),
    metadata=SimpleNamespace(tensordesc_meta=None),
)


def test_a_launch_passes_its_arguments_in_declaration_order(direct: dict[str, Any]) -> None:
    q = torch.empty(4)
    assert triton_plan._launched_directly(KERNEL, COMPILED, 1, (3,), (q,), {"BLOCK": 64, "n": 5})
    assert direct["device"] == 1 and direct["grid"] == (3, 1, 1)
    assert direct["values"] == [q, 5, 64] and direct["types"] == ["*fp16", "i32", "constexpr"]
    assert direct["answer"].runs == [(78, {}, (), 0)]  # on the device's current stream


def test_an_empty_grid_launches_nothing(direct: dict[str, Any]) -> None:
    assert triton_plan._launched_directly(KERNEL, COMPILED, 0, (0, 4), (1, 2, 3), {})
    assert "grid" not in direct  # as Triton's launcher, which skips an empty grid


@pytest.mark.parametrize(
    ("compiled", "grid", "args", "why"),
    [
        (COMPILED, (2,), (1, 2), "an argument left to its default"),
        (COMPILED, lambda meta: (2,), (1, 2, 3), "a grid computed by a callable"),
        (SimpleNamespace(result=lambda: None), (2,), (1, 2, 3), "compiling elsewhere"),
        (None, (2,), (1, 2, 3), "no compiled kernel"),
    ],
)
def test_what_attnccs_launcher_cannot_issue_goes_to_triton(
    direct: dict[str, Any], compiled: Any, grid: Any, args: Any, why: str
) -> None:
    assert not triton_plan._launched_directly(KERNEL, compiled, 0, grid, args, {}), why
    assert direct["answer"].runs == []


def test_a_refused_packing_or_a_profilers_hook_goes_to_triton(
    direct: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct["answer"] = "the kernel's parameters differ from Triton's signature"
    assert not triton_plan._launched_directly(KERNEL, COMPILED, 0, (1,), (1, 2, 3), {})
    direct["answer"] = _Launch()
    monkeypatch.setattr(triton_plan, "_launch_hooks", lambda: True)
    assert not triton_plan._launched_directly(KERNEL, COMPILED, 0, (1,), (1, 2, 3), {})
    assert direct["answer"].runs == []
