"""What every pass is: a name and a pure ``run(kernel) -> kernel``."""

from __future__ import annotations

from typing import Protocol

from attncc.ir.nodes import AttentionKernel


class Pass(Protocol):
    @property
    def name(self) -> str: ...

    def run(self, kernel: AttentionKernel) -> AttentionKernel: ...
