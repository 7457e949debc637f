"""``export``: the samples of a file as JSON, every real exact.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
import numpy as np
from pskd_jax.format.reader import Reader
from pskd_jax.format.encodings import REAL_DTYPES, Encoding
from pskd_jax._os.atomic import atomic_output

CHUNK_ELEMENTS = 1 << 20  # bounds the memory of export, whatever the file's size


def plain(value: Any) -> Any:
    """A sample's pytree → plain Python (lists, tuples, dicts, ints, floats) for printing or JSON.

    Reals become Python floats holding the stored value exactly (bf16 and f32 widen exactly).
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fV" or value.dtype == REAL_DTYPES[Encoding.BF16]:
            return value.astype(np.float64).tolist()
        return value.tolist()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {f: plain(getattr(value, f)) for f in value._fields}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value

def export_json(path: str, output: str, *, layout: Any = None) -> int:
    """Writes the samples of ``path`` as JSON to ``output``; returns the number of samples.

    ``{"type": …, "version": …, "encodings": […], "samples": […]}``: tensors as nested lists,
    tuples as lists, parameter trees as objects. Every real is the shortest decimal that reads
    back to the stored value (Python's float repr), so a reader in f64 gets the exact number.
    """
    with Reader(path, layout=layout) as reader:
        placement = reader.placement
        if placement is None:
            reader.samples()  # raises E9001 naming what is missing
        head = {
            "type": reader.header.type_text,
            "version": reader.header.version,
            "encodings": [
                enc.label if leaf.is_real else "idx"
                for leaf, enc in zip(placement.layout.leaves, placement.encodings)
            ],
            "count": len(reader),
        }
        layout = placement.layout
        per_sample = max(1, layout.sample_elements)
        step = max(1, CHUNK_ELEMENTS // per_sample)
        with atomic_output(output) as f:
            f.write(json.dumps(head, ensure_ascii=False)[:-1].encode("utf-8"))
            f.write(b', "samples": [')
            for start in range(0, len(reader), step):
                # gathered, not viewed: idx values are checked against their bound (E9004)
                chunk = reader.gather_leaves(np.arange(start, min(start + step, len(reader))))
                columns = [plain(leaf) for leaf in chunk]
                for k, row in enumerate(zip(*columns)):
                    sample = plain(layout.unflatten(list(row)))
                    separator = b"" if start + k == 0 else b", "
                    f.write(separator + json.dumps(sample, ensure_ascii=False, allow_nan=False).encode("utf-8"))
            f.write(b"]}\n")
        return len(reader)


__all__ = ["CHUNK_ELEMENTS", "export_json", "plain"]
