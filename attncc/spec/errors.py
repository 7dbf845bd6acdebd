"""Errors a spec author sees: ``file:line:col: error: message``, the line, a caret, a hint."""

from __future__ import annotations

from attncc.spec.ast import Span


class SpecError(Exception):
    """A problem in a spec, pinned to a source span."""

    def __init__(
        self,
        message: str,
        span: Span | None,
        hint: str | None = None,
        *,
        source: str | None = None,
        filename: str = "<spec>",
    ) -> None:
        self.message = message
        self.span = span
        self.hint = hint
        self.source = source
        self.filename = filename
        super().__init__(self.render())

    def with_source(self, source: str, filename: str) -> SpecError:
        return SpecError(self.message, self.span, self.hint, source=source, filename=filename)

    def render(self) -> str:
        if self.span is None:
            text = f"{self.filename}: error: {self.message}"
        else:
            text = f"{self.filename}:{self.span.line}:{self.span.column}: error: {self.message}"
            if self.source is not None:
                lines = self.source.splitlines()
                if 0 < self.span.line <= len(lines):
                    line = lines[self.span.line - 1]
                    if self.span.end_line == self.span.line:
                        width = max(1, self.span.end_column - self.span.column)
                    else:
                        width = max(1, len(line) - self.span.column + 1)
                    # keep tabs so the caret lines up under the same column as the text
                    pad = "".join(c if c == "\t" else " " for c in line[: self.span.column - 1])
                    text += f"\n    {line}\n    {pad}^{'~' * (width - 1)}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def __str__(self) -> str:
        return self.render()
