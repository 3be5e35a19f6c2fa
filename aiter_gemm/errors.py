"""The error every file reader of the package raises for a file it cannot use (a module of its own so that the
lowest layer, :mod:`aiter_gemm.fileio`, can raise it without importing the config parser)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file that cannot be used as written; names the file, line (1-based, header = 1; None: the whole file)
    and column."""

    def __init__(self, path: str, line: int | None, column: str | None, message: str) -> None:
        where = f"{path}" + (f":{line}" if line is not None else "") + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = path, line, column
