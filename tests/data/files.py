"""Writing a test's input file."""

from __future__ import annotations


def write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)
