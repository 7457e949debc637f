"""A restore's read planning: what the file holds (its layout file, an explicit layout, its closed
type, or the target's description), what each target leaf asks for, and which saved leaf each
target leaf reads — by key path through the layout file, or by position — checked pair by pair
before a byte of data is read (E9005 listing what differs).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.stored import StoredFile
from pskd_jax.checkpoint.targets import TargetSpec, category, spec_of
from pskd_jax.errors import MismatchError, NotClosedError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.layout_file import (
    LayoutFile,
    layout_beside,
    layout_from_bytes,
    read_layout_file,
)
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader, template_mismatch
from pskd_jax.format.sample_type import IndexType, TupleType, parse_type
from pskd_jax.storage import locate, store_for

MAX_LISTED = 20  # key paths a mismatch lists of each kind before abridging


# --------------------------------------------------------------------------------------------
# What the file holds


@dataclasses.dataclass
class FileView:
    """The leaves of a file in storage order, how each gives its value back (None: as stored),
    whether they are matched to a target by key path, and how they form a tree without one."""

    layout: Layout
    forms: Sequence[sd.Form | None]
    by_path: bool
    layout_file: LayoutFile | None = None


def _form_of_spec(spec: TargetSpec, value: Any) -> sd.Form:
    """How a target leaf would have been stored (a file without a layout file is read so)."""
    if spec.key is not None:
        return sd.key_form(*spec.key)
    form = sd.python_form(value) if spec.python is not None else sd.form_of_dtype(spec.dtype)
    assert form is not None  # (spec_of takes only what a checkpoint can store)
    return form


def _stored_leaf(path: str, spec: TargetSpec, form: sd.Form, value: Any) -> Leaf:
    if spec.python is int:
        return Leaf(path, tuple(np.shape(sd.python_int_pattern(value))), form.bound)
    shape = form.stored_shape(spec.shape) if form.trailing is not None else spec.shape
    return Leaf(path, shape, form.bound)


def _closed_forms(type_text: str, layout: Layout) -> list[sd.Form | None]:
    """A closed type's leaves: ``bool`` ones give bools back, the others their stored values."""
    parsed = parse_type(type_text)
    items = parsed.items if isinstance(parsed, TupleType) else (parsed,)
    forms: list[sd.Form | None] = []
    for item in items:
        is_bool = isinstance(item, IndexType) and item.is_bool
        forms.append(sd.Form(sd.KIND_VALUE, "bool", 2) if is_bool else None)
    return forms if len(forms) == len(layout.leaves) else [None] * len(layout.leaves)


def file_view(reader: Reader | StoredFile, layout: Any, target_pairs, specs: list[TargetSpec] | None) -> FileView:
    """How to read the file: its layout file (by key path), an explicit layout, its closed type, or
    — a ``params`` file without a layout file — the target (by position)."""
    path = reader.path
    if layout is not None:
        if isinstance(layout, (str, os.PathLike)):
            found = _given_layout(reader, layout)
            return FileView(found.layout, list(found.forms), True, found)
        if isinstance(layout, LayoutFile):  # (read already: its forms and key paths serve)
            _check(reader, layout)
            return FileView(layout.layout, list(layout.forms) or [None] * len(layout.layout.leaves), True, layout)
        if isinstance(layout, Layout):
            return FileView(layout, [None] * len(layout.leaves), False)
        template_pairs, rebuild = tree_lib.flatten(layout, what="the layout template")
        template_specs = [spec_of(p, s, True) for p, s in template_pairs]
        view = _template_view(template_pairs, template_specs, rebuild)
        beside = None
        if reader.header.is_params:
            beside = _beside(reader)
        return view if beside is None else _template_by_path(path, view, beside.layout, rebuild)
    if not reader.header.is_params:
        own = Layout.of_type(reader.header.type_text)
        return FileView(own, _closed_forms(reader.header.type_text, own), False)
    beside = _beside(reader)
    if beside is not None:
        return FileView(beside.layout, list(beside.forms), True, beside)
    if target_pairs is None:
        raise NotClosedError(f"{path}: type {reader.header.type_text!r} needs its layout: pass a target pytree, "
                             f"layout=..., or keep {os.path.basename(layout_path_for(path))} beside it")
    assert specs is not None  # (given with the target's pairs)
    return _template_view(target_pairs, specs, None)


def _check(reader: Reader | StoredFile, layout_file: LayoutFile) -> None:
    """Refuses (E9005 naming both) a layout file that is not the file's, or not the version of the
    object the reader reads."""
    if isinstance(reader, StoredFile):
        reader.check(layout_file)
    else:
        reader.check_layout(layout_file)


def _beside(reader: Reader | StoredFile) -> LayoutFile | None:
    """The layout file beside the reader's file, proven to belong to the very file (or version of
    an object) the reader reads, or None when there is none."""
    if isinstance(reader, StoredFile):
        return reader.beside()
    found = layout_beside(reader.path)  # (the restore reads the pair again when a save overtakes it)
    if found is not None:  # (find_layout_file looked at the file, or object, at the path: perhaps since replaced)
        reader.check_layout(found)
    return found


def _template_by_path(path: str, view: FileView, saved: Layout, rebuild) -> FileView:
    """A layout template's view of a file that has its layout file: the template's leaves matched
    to the saved ones by key path (E9005 listing what differs, or naming a leaf of another shape or
    kind), put in storage order, and rebuilt into the template's containers. Never by position:
    two leaves of one shape in another order would be swapped."""
    order = match_by_path(path, saved, [leaf.path for leaf in view.layout.leaves], partial=False)
    where = {i: k for k, i in enumerate(order)}  # saved leaf → template leaf
    for k, i in enumerate(order):
        mine, theirs = view.layout.leaves[k], saved.leaves[i]
        if mine.shape != theirs.shape or mine.is_real != theirs.is_real:
            raise MismatchError(f"{path}: at {mine.path or '(root)'}: the layout template has "
                                f"{'reals' if mine.is_real else 'indices'} of stored shape {list(mine.shape)}, "
                                f"the checkpoint {'reals' if theirs.is_real else 'indices'} of stored shape "
                                f"{list(theirs.shape)}")
    leaves = tuple(view.layout.leaves[where[i]] for i in range(len(order)))
    forms = [view.forms[where[i]] for i in range(len(order))]

    def in_template_order(values: Sequence[Any]) -> Any:
        return (rebuild if rebuild is not None else list)([values[i] for i in order])

    return FileView(Layout(leaves, tuple(range(len(leaves))), in_template_order), forms, True)


def _given_layout(reader: Reader | StoredFile, layout: str | os.PathLike) -> LayoutFile:
    """The layout file a restore was given by path or URL, proven to belong to the checkpoint."""
    where = locate(layout)
    if where.is_local:
        found = read_layout_file(where.path)
        _check(reader, found)
        return found
    store = store_for(where)
    if isinstance(reader, StoredFile):
        return reader.layout_at(store, where.key)
    raw, _ = store.get(where.key)
    found = layout_from_bytes(raw, where.url)
    _check(reader, found)
    return found


def _template_view(pairs, specs: list[TargetSpec], rebuild) -> FileView:
    forms = [_form_of_spec(spec, value) for spec, (_, value) in zip(specs, pairs)]
    leaves = tuple(_stored_leaf(p, spec, form, value) for (p, value), spec, form in zip(pairs, specs, forms))
    return FileView(Layout(leaves, tuple(range(len(leaves))), rebuild), forms, False)


# --------------------------------------------------------------------------------------------
# Matching the target's leaves to the file's


def _listed(paths: Sequence[str]) -> str:
    shown = ", ".join(p or "(root)" for p in paths[:MAX_LISTED])
    return shown + (f", … and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")


def _mismatch(path: str, missing: list[str], extra: list[str], *, partial: bool) -> str:
    """The message of a target that names other key paths than the file."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} key path(s) of the target not in the checkpoint: {_listed(missing)}")
    if extra:
        parts.append(f"{len(extra)} key path(s) of the checkpoint not in the target: {_listed(extra)}"
                     + ("" if partial else " (restore(..., partial=True) restores a subset)"))
    return f"{path}: " + "; ".join(parts)


def _without_value(path: str) -> str | None:
    """A flax Variable's key path without its ``.value`` (a pure dict's), or None."""
    return path[: -len(".value")] if path.endswith(".value") else None


def match_by_path(path: str, file_layout: Layout, target_paths: list[str], partial: bool) -> list[int]:
    """The file leaf of each target leaf, by key path (a Variable's ``….value`` also matches a pure
    dict's ``…`` and back); E9005 listing every missing and extra key path."""
    index = {leaf.path: i for i, leaf in enumerate(file_layout.leaves)}
    aliases: dict[str, int | None] = {}
    for position, leaf in enumerate(file_layout.leaves):
        for alias in (_without_value(leaf.path), leaf.path + ".value"):
            if alias is not None and alias not in index:
                aliases[alias] = None if alias in aliases else position  # (an ambiguous alias matches nothing)
    chosen: list[int | None] = []
    missing: list[str] = []
    for target_path in target_paths:
        i = index.get(target_path)
        if i is None:
            i = aliases.get(target_path)
        if i is None:
            missing.append(target_path)
        chosen.append(i)
    found = [c for c in chosen if c is not None]
    used = set(found)
    if len(used) != len(found):
        twice = [p for p, c in zip(target_paths, chosen) if c is not None and chosen.count(c) > 1]
        raise MismatchError(f"{path}: target key paths {_listed(twice)} name the same saved leaf")
    extra = [] if partial else [leaf.path for i, leaf in enumerate(file_layout.leaves) if i not in used]
    if missing or extra:
        raise MismatchError(_mismatch(path, missing, extra, partial=partial))
    return [i for i in chosen if i is not None]  # (every one: none is missing)


def match_by_position(path: str, file_layout: Layout, target_paths: list[str]) -> list[int]:
    """The file leaves in order; E9005 naming what differs, and saying when the target holds the
    same leaves in another order (a dict sorted by ``jax.tree.map``)."""
    problem = template_mismatch(target_paths, [leaf.path for leaf in file_layout.leaves], listed=MAX_LISTED)
    if problem is not None:
        raise MismatchError(f"{path}: {problem} (without a layout file, leaves are matched by position, in the "
                            "order they were saved)")
    return list(range(len(target_paths)))


def _value_shape(leaf: Leaf, form: sd.Form | None) -> tuple[int, ...]:
    return form.value_shape(leaf.shape) if form is not None else leaf.shape


def _saved_category(leaf: Leaf, form: sd.Form | None) -> str:
    if form is None:
        return "real" if leaf.is_real else "int"
    if form.kind == sd.KIND_KEY:
        return "key"
    if form.kind == sd.KIND_PYTHON:
        return {"bool": "bool", "int": "int", "float": "real"}[form.dtype]
    named = sd.dtype_named(form.dtype)
    assert named is not None  # (the stored dtypes of the other kinds have names)
    return category(named)


def _describe_saved(leaf: Leaf, form: sd.Form | None, placement: Placement, i: int) -> str:
    shape = _value_shape(leaf, form)
    if form is not None and form.kind == sd.KIND_PYTHON:
        return f"a Python {form.dtype}"
    name = form.dtype if form is not None else sd.dtype_name(placement.value_dtype(i))
    return f"{shape} {name}"


_COMPATIBLE = {("bool", "int"), ("int", "bool")}


def check_pair(path: str, leaf: Leaf, form: sd.Form | None, spec: TargetSpec, placement: Placement, i: int) -> None:
    """Refuses a target leaf whose shape or kind of value differs from the saved one (E9005)."""
    where = f"{path}: at {leaf.path or '(root)'}"
    saved_shape = _value_shape(leaf, form)
    if spec.shape != saved_shape:
        raise MismatchError(f"{where}: expected {spec.describe()}, found {_describe_saved(leaf, form, placement, i)}")
    have, want = _saved_category(leaf, form), spec.category
    if have == want or (have, want) in _COMPATIBLE:
        if have == "key" and form is not None and spec.key is not None and form.impl != spec.key[0]:
            raise MismatchError(f"{where}: expected keys of {spec.key[0]}, found keys of {form.impl}")
        return
    found = {"real": "reals", "int": f"indices below {leaf.bound}", "bool": "bools", "complex": "complex numbers",
             "key": "PRNG keys"}[have]
    raise MismatchError(f"{where}: expected {spec.describe()}, found {found}")


# --------------------------------------------------------------------------------------------
# The plan


@dataclasses.dataclass(frozen=True)
class Target:
    """A restore's target as its leaves: (key path, leaf) pairs, what each asks for, and how values
    rebuild its containers."""

    pairs: list[tuple[str, Any]]
    specs: list[TargetSpec]
    rebuild: Callable[[list[Any]], Any]

    @classmethod
    def of(cls, target: Any, *, as_numpy: bool) -> Target:
        """``target`` walked (E9005 naming a leaf no restore gives); ``as_numpy``: its leaves are
        wanted as numpy arrays (their shardings are not used)."""
        pairs, rebuild = tree_lib.flatten(target, what="the target")
        return cls(pairs, [spec_of(p, s, as_numpy) for p, s in pairs], rebuild)


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What a restore reads: how the file's leaves are seen (``view``), the saved leaf each target
    leaf reads (``chosen``, in the target's order; every leaf in storage order without a target),
    what each asks for (``specs``: None without a target), and how the values form the result."""

    view: FileView
    placement: Placement  # where the file's leaves are, by the view's layout
    chosen: list[int]
    specs: list[TargetSpec | None]
    rebuild: Callable[[list[Any]], Any] | None

    def tree(self, values: list[Any]) -> Any:
        """The restored tree of ``values`` (one a chosen leaf): the target's containers, else the
        ones the layout records."""
        return self.rebuild(values) if self.rebuild is not None else self.view.layout.unflatten(values)


def plan_read(reader: Reader | StoredFile, target: Target | None, *, layout: Any = None,
              partial: bool = False) -> ReadPlan:
    """The read plan of a restore of ``reader``'s file into ``target`` (None: as saved); the reader
    is given the layout it plans with. ``partial`` (with a target) matches a subset by key path."""
    path = reader.path
    view = file_view(reader, layout, target.pairs if target else None, target.specs if target else None)
    if partial and not view.by_path:
        raise NotClosedError(f"{path}: partial=True matches key paths through the layout file, and there "
                             f"is none ({os.path.basename(layout_path_for(path))})")
    placement = reader.with_layout(view.layout).placement
    assert placement is not None  # (with_layout places the leaves, or refuses)
    if reader.header.count != 1:
        raise MismatchError(f"{path}: a checkpoint holds one sample, this file holds {reader.header.count}")
    if target is None:
        every = list(range(len(view.layout.leaves)))
        return ReadPlan(view, placement, every, [None] * len(every), None)
    target_paths = [p for p, _ in target.pairs]
    if view.by_path:
        chosen = match_by_path(path, view.layout, target_paths, partial)
    else:
        chosen = match_by_position(path, view.layout, target_paths)
    for k, i in enumerate(chosen):
        check_pair(path, view.layout.leaves[i], view.forms[i], target.specs[k], placement, i)
    return ReadPlan(view, placement, chosen, list(target.specs), target.rebuild)


__all__ = ["MAX_LISTED", "FileView", "ReadPlan", "Target", "check_pair", "file_view", "match_by_path",
           "match_by_position", "plan_read"]
