"""Where each leaf of a sample lies, and how its elements are stored: shared by the reader and the writers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pskd_jax.errors import MismatchError, NotClosedError, NotPskdError
from pskd_jax.format.encodings import REAL_DISK_DTYPES, REAL_DTYPES, Encoding, index_dtype
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.sample_type import MAX_AXES, MAX_INDEX_BOUND, MAX_SAMPLE_ELEMENTS


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each leaf sits in a sample and how its elements are stored."""

    layout: Layout
    encodings: tuple[Encoding, ...]
    offsets: tuple[int, ...]
    disk_dtypes: tuple[np.dtype, ...]
    sample_bytes: int

    @classmethod
    def of(cls, layout: Layout, encodings: Sequence[Encoding] | None, path: str = "", *,
           from_header: bool = False) -> Placement:
        """Places the leaves. An idx leaf with a narrow encoding is a malformed header when read
        (``from_header``, E9002), and a request that does not fit the type when writing (E9005)."""
        where = f"{path}: " if path else ""
        if encodings is None or len(encodings) == 0:  # an empty list means every leaf f64
            encodings = [Encoding.F64] * len(layout.leaves)
        if len(encodings) != len(layout.leaves):
            raise MismatchError(f"{where}{len(encodings)} leaf encodings for a type of {len(layout.leaves)} leaves")
        offsets, dtypes, position = [], [], 0
        for leaf, encoding in zip(layout.leaves, encodings):
            _check_leaf(leaf, where)
            if leaf.is_real:
                dtype = REAL_DISK_DTYPES[Encoding(encoding)]
            elif encoding != Encoding.F64:
                raise (NotPskdError if from_header else MismatchError)(
                    f"{where}leaf {leaf.path or '(root)'} is idx[{leaf.bound}] but its encoding is "
                    f"{Encoding(encoding).label}; idx leaves carry encoding 0",
                )
            else:
                assert leaf.bound is not None  # (not real: an idx leaf)
                dtype = index_dtype(leaf.bound)
            offsets.append(position)
            dtypes.append(dtype)
            position += leaf.size * dtype.itemsize
        return cls(layout, tuple(Encoding(e) for e in encodings), tuple(offsets), tuple(dtypes), position)

    @property
    def labels(self) -> tuple[str, ...]:
        """Each leaf's encoding as a summary names it (:func:`encoding_labels`)."""
        return encoding_labels(self.layout.leaves, self.encodings)

    def value_dtype(self, i: int) -> np.dtype:
        """The dtype of leaf i's values in memory (bfloat16 for bf16, whose disk dtype is u2)."""
        leaf = self.layout.leaves[i]
        return REAL_DTYPES[self.encodings[i]] if leaf.is_real else self.disk_dtypes[i]


def encoding_labels(leaves: Sequence[Leaf], encodings: Sequence[Encoding]) -> tuple[str, ...]:
    """Each leaf's encoding as a summary line names it: f64, f32 or bf16 for a real leaf, idx for an
    index leaf (its encoding byte is 0, which is no f64: its elements are unsigned integers)."""
    return tuple(Encoding(e).label if leaf.is_real else "idx" for leaf, e in zip(leaves, encodings))


def _check_leaf(leaf: Leaf, where: str) -> None:
    """Refuses a leaf no file can hold (E9001): a layout may come from outside the type text (a
    template, a layout file), and a hostile one must fail here rather than in numpy."""
    shape, bound = leaf.shape, leaf.bound
    problem = None
    if not isinstance(shape, tuple) or len(shape) > MAX_AXES:
        problem = f"a shape of more than {MAX_AXES} axes" if isinstance(shape, tuple) else "no shape"
    elif any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d <= MAX_SAMPLE_ELEMENTS
             for d in shape):
        problem = f"shape {list(shape)}: every length is an integer in [0, 2^60]"
    elif bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, np.integer))
                                or not 1 <= bound <= MAX_INDEX_BOUND):
        problem = f"idx[{bound}]: an index bound is an integer in [1, 2^64]"
    if problem:
        raise NotClosedError(f"{where}leaf {leaf.path or '(root)'}: {problem}")


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides of a C-ordered array of ``shape`` (computed, never allocated)."""
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


__all__ = ["Placement", "c_strides", "encoding_labels"]
