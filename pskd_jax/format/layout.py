"""The leaves of a sample type in storage order, and the pytree they form.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from pskd_jax.errors import NotClosedError
from pskd_jax.format.sample_type import MAX_SAMPLE_ELEMENTS, IndexType, ParamsType, SampleType, TupleType, parse_type


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One tensor of a sample, in storage order.

    ``bound`` is ``None`` for a real leaf and N for ``idx[N]`` (2 for ``bool``). ``path`` is the
    leaf's key path in the pytree, written as ``jax.tree_util.keystr`` writes it.
    """

    path: str
    shape: tuple[int, ...]
    bound: int | None = None

    @property
    def is_real(self) -> bool:
        return self.bound is None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The leaves of a sample type in storage order, and how they form a pytree.

    ``structure`` is a nested value whose ints are leaf numbers: an int for a single leaf, a tuple
    for a tuple type. For ``params`` types built from a template, ``rebuild`` puts leaves back into
    the template's own containers.
    """

    leaves: tuple[Leaf, ...]
    structure: Any
    rebuild: Callable[[Sequence[Any]], Any] | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def of_type(cls, text_or_type: str | SampleType) -> Layout:
        """The layout of a closed type; ``params M`` needs its template (E9001).

        >>> [leaf.shape for leaf in Layout.of_type("(idx[64][seq: 8], ℝ[2, 3])").leaves]
        [(8,), (2, 3)]
        """
        parsed = parse_type(text_or_type) if isinstance(text_or_type, str) else text_or_type
        leaves: list[Leaf] = []
        structure = _collect(parsed, leaves, "")
        _check_sizes(leaves)
        return cls(tuple(leaves), structure)

    def unflatten(self, values: Sequence[Any]) -> Any:
        """Puts one value per leaf (in storage order) into the layout's pytree."""
        if len(values) != len(self.leaves):
            raise ValueError(f"{len(values)} values for {len(self.leaves)} leaves")
        if self.rebuild is not None:
            return self.rebuild(values)
        return _place(self.structure, values)

    @property
    def sample_elements(self) -> int:
        return sum(leaf.size for leaf in self.leaves)


def _collect(parsed: SampleType, leaves: list[Leaf], path: str) -> Any:
    if isinstance(parsed, TupleType):
        return tuple(_collect(item, leaves, f"{path}[{i}]") for i, item in enumerate(parsed.items))
    if isinstance(parsed, ParamsType):
        raise NotClosedError(f"params {parsed.name}: the leaves of a parameter tree come from the program; "
                             "supply its layout (a template pytree or a layout JSON)")
    shape = tuple(d.size for d in parsed.dims)
    bound = parsed.bound if isinstance(parsed, IndexType) else None
    leaves.append(Leaf(path, shape, bound))
    return len(leaves) - 1


def _check_sizes(leaves: Sequence[Leaf]) -> None:
    total = 0
    for leaf in leaves:
        if math.prod(d for d in leaf.shape if d) > MAX_SAMPLE_ELEMENTS:  # numpy counts empty axes as 1
            raise NotClosedError(f"leaf {leaf.path or '(root)'}: more than 2^60 elements "
                                        "(an empty axis counted as one)")
        total += leaf.size
        if total > MAX_SAMPLE_ELEMENTS:
            raise NotClosedError(f"leaf {leaf.path or '(root)'}: a sample of more than 2^60 elements")


def _place(structure: Any, values: Sequence[Any]) -> Any:
    if isinstance(structure, tuple):
        return tuple(_place(item, values) for item in structure)
    return values[structure]


__all__ = ["Layout", "Leaf"]
