"""The layout file beside a ``params`` file (``NAME.layout.json``): reading it, and proving that it
belongs to the data file beside it.

Its fields, its versions and the identity rule (a layout file whose data file differs is refused,
E9005 naming both) are defined in ``docs/checkpoints.md`` ("The layout file"); the kinds in
``docs/checkpoint-dtypes.md``. Every value in a layout file is checked (E9001 naming the file):
shapes and bounds are integers, each dtype agrees with its stored leaf. Never imports JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

import xxhash

from pskd_jax._os.files import open_fd, open_regular
from pskd_jax._os.jsonfile import MAX_FILE_BYTES, loads_strict
from pskd_jax._os.locks import commit_cut_short
from pskd_jax._os.names import layout_before, layout_path_for, older_layout_paths, save_lock
from pskd_jax.errors import MismatchError, NotClosedError, NotPskdError, PskdError, TruncatedError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.byte_sources import ByteSource, StoreBytes, open_bytes, read_small
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import Header, read_header
from pskd_jax.format.keypaths import MAX_KEY_DEPTH, nested_rebuild, path_keys
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.one_save import FileIdentity, identity_of, of_held_file, until_one_save
from pskd_jax.format.placement import Placement
from pskd_jax.format.tree import build_described, check_description, described_paths
from pskd_jax.storage import is_object_url, locate, resolve

LAYOUT_FORMAT = "pskd-layout"

_ENCODINGS = {encoding.label: encoding for encoding in Encoding}

LAYOUT_VERSION = 2  # written; version 1 (no identity, no kinds, no tree) is still read

READ_VERSIONS = (1, 2)


@dataclasses.dataclass(frozen=True)
class LayoutFile:
    """A layout file read back: the layout (leaves in storage order, rebuilt into the recorded
    tree), the type it was written for, each leaf's dtype name and key path keys, and — version 2
    — each leaf's form (how its stored elements give its value back; None: as stored), the tree's
    description, what identifies its data file, and anything else recorded (``safetensors``)."""

    layout: Layout
    type_text: str
    dtypes: tuple[str, ...]
    keys: tuple[tuple[str | int, ...], ...]
    forms: tuple[sd.Form | None, ...] = ()
    description: Any = None
    identity: dict | None = None
    version: int = LAYOUT_VERSION
    path: str = ""
    extra: dict = dataclasses.field(default_factory=dict)
    #: The local data file this layout file was proven to belong to, read within one save of it
    #: (its path and :func:`~pskd_jax.format.one_save.identity_of`), None when not proven so: a
    #: reader of that path takes it only for that very file (:meth:`Reader.check_layout`), never
    #: for the next save's data, whose header and size can be the same.
    paired: tuple[str, FileIdentity] | None = dataclasses.field(default=None, compare=False, repr=False)
    #: How this layout file was looked up for a data file: ``(data, None, None)`` by
    #: ``find_layout_file(data)``, ``(data, path, xxh3_128)`` by ``read_layout_file(path,
    #: data=data, xxh3_128=…)``; None when it was not (read without its data, made from bytes or by
    #: hand). A reader that finds the data saved again since (:class:`OtherVersion`) looks the pair
    #: up again so (:func:`layout_after`), as it would look up its own; one never looked up is
    #: used as given, and refused.
    looked_up: tuple[str, str | None, str | None] | None = dataclasses.field(default=None, compare=False,
                                                                             repr=False)


class OtherVersion(MismatchError):
    """E9005: a layout object that records another version of its data object (its URL and the
    version tag the save's put was given) than the one read, or a layout file proven to belong to
    another local data file than the one read (:attr:`LayoutFile.paired`): a save of the checkpoint
    ran between the reads of the two, or one was cut off between its data and its layout. A
    restore reads the pair again; anything else refuses it."""


def header_digest(header_bytes: bytes) -> str:
    """The digest of a data file's header that a layout file records."""
    return xxhash.xxh3_128(header_bytes).hexdigest()


def read_layout_file(path: str | os.PathLike, *, data: str | os.PathLike | None = None,
                     xxh3_128: str | None = None) -> LayoutFile:
    """Reads ``NAME.layout.json`` (E9001 naming the file when it is not one). With ``data``, also
    proves that it belongs to that data file (:func:`check_belongs`, given ``xxh3_128``: the data
    file's whole digest, when the caller has it)."""
    path = os.fspath(path)
    if data is None:
        return _read_checked(path, data, xxh3_128)
    found = _read_for(path, data, xxh3_128, again=True)
    # (looked up again with the caller's digest too: a later save's layout that records another is refused)
    return dataclasses.replace(found, looked_up=(os.fspath(data), path, xxh3_128))


def _read_for(path: str, data: str | os.PathLike, xxh3_128: str | None, *, again: bool) -> LayoutFile:
    """:func:`read_layout_file` of ``path`` for ``data``: of a local data file, within one save of
    it; of an object, read again while a save of it overtakes the read (``again``: the caller does
    not read the pair again itself, as a restore does)."""
    if not locate(data).is_local:
        read = functools.partial(_read_checked, path, data, xxh3_128)
        return _of_one_version(os.fspath(data), read) if again else read()
    found = _of_one_save(locate(data).path, lambda: _read_checked(path, data, xxh3_128))
    assert found is not None  # (a layout file read, or its error)
    return found


def looked_up_again(layout_file: LayoutFile) -> LayoutFile | None:
    """The layout file looked up again as ``layout_file`` was (:attr:`LayoutFile.looked_up`: by
    :func:`find_layout_file` of its data, or :func:`read_layout_file` of its path for its data),
    now: what a reader that found the data saved again since uses instead (None: none stands
    beside the data now). Its errors are the look-up's. One look-up: an object's that a save of it
    overtakes raises :class:`OtherVersion` at once (its caller, a reader that reads the pair again
    itself, is the one loop that tries again: a loop of its own here would multiply the reads and
    the pauses of the caller's)."""
    assert layout_file.looked_up is not None  # (the caller asks only of one looked up)
    data, path, xxh3_128 = layout_file.looked_up
    if path is None:
        return layout_beside(data)
    found = _read_for(path, data, xxh3_128, again=False)
    return dataclasses.replace(found, looked_up=(data, path, xxh3_128))


def layout_after(error: OtherVersion, layout_file: LayoutFile) -> LayoutFile | None:
    """What a reader given ``layout_file``, and finding it of another save than the data it opened
    (``error``), reads that data through next: the layout looked up again as ``layout_file`` was
    (:func:`looked_up_again`; None: none stands beside the data now), as the reader would look up
    its own; ``error`` for one never looked up (made or read by hand: used as given, and refused
    when it does not pair). Every reader that takes a layout file from its caller (a restore, the
    read-only commands) replaces it so, and nothing else."""
    if layout_file.looked_up is None:
        raise error
    try:
        return looked_up_again(layout_file)
    except OtherVersion:
        return layout_file  # (the look-up overtaken by a save too: the reader's next attempt looks again)


def _of_one_version(data: str, read: Callable[[], LayoutFile]) -> LayoutFile:
    """``read()``'s layout object of the data object ``data``, read again while it records another
    version of the object than the one its proof read (:class:`OtherVersion`: a save of the key
    between the two reads, or between its data's put and its layout's): E9005 after
    :data:`~pskd_jax.format.one_save.ATTEMPTS`."""
    def attempt() -> tuple[bool, LayoutFile | None]:
        try:
            return True, read()
        except OtherVersion:
            return False, None

    found = until_one_save(data, attempt, reading="its layout file was read", again="read it again")
    assert found is not None  # (an attempt that is done has its layout file)
    return found


def _read_checked(path: str, data: str | os.PathLike | None, xxh3_128: str | None = None) -> LayoutFile:
    """:func:`read_layout_file`, its proof against ``data`` made by the path (the caller makes sure
    that path names one data file throughout, where it must)."""
    layout_file = read_layout_and_bytes(path)[1]
    if data is not None:
        check_belongs(layout_file, data, xxh3_128=xxh3_128)
    return layout_file


def _of_one_save(data: str, read: Callable[[], LayoutFile | None]) -> LayoutFile | None:
    """``read()``'s layout file of the local data file ``data`` — read, and proven to belong, by
    the path — within one save of it (:func:`~pskd_jax.format.one_save.of_held_file`, tried again
    while saves overtake it: E9005 after :data:`~pskd_jax.format.one_save.ATTEMPTS`), and paired
    with the very data file it was proven against (:attr:`LayoutFile.paired`)."""
    def attempt() -> tuple[bool, LayoutFile | None]:
        try:
            fd = open_fd(data, NotPskdError)
        except PskdError:
            return True, read()  # (no data file to hold: what read() finds of it, none or its error, stands)
        try:
            held = identity_of(fd)
            done, found = of_held_file(data, held, read)
        finally:
            os.close(fd)
        if not done or found is None:
            return done, None
        return True, dataclasses.replace(found, paired=(data, held))

    return until_one_save(data, attempt, reading="its layout file was read", again="read it again")


def read_layout_and_bytes(path: str | os.PathLike) -> tuple[bytes, LayoutFile]:
    """The bytes of a layout file (or object) and the layout file they make (E9001 naming it when
    they make none): read once, so that what is checked against a recorded digest is what is used."""
    path = os.fspath(path)
    raw = read_small(path, NotClosedError, what="the layout file", limit=MAX_FILE_BYTES)  # a file or an object
    return raw, _parsed(loads_strict(raw, path, NotClosedError), path)


def layout_from_bytes(raw: bytes, path: str) -> LayoutFile:
    """A layout file read from its bytes (an object of a store), ``path`` naming it (E9001 naming
    it when it is not one)."""
    return _parsed(loads_strict(raw, path, NotClosedError, kind="JSON"), path)


def _parsed(content: Any, path: str) -> LayoutFile:
    try:
        return _parse(content, path)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError) as e:
        # (OverflowError: int() of an infinite number, which the JSON decoder makes of 1e999)
        raise NotClosedError(f"{path}: not a layout file ({str(e)[:300]})") from None


def _parse(content: Any, path: str) -> LayoutFile:
    if not isinstance(content, dict):
        raise ValueError(f"a JSON {type(content).__name__}, not an object")
    version = content.get("version")
    # (a version is an int: 3.0 and True equal 3 and 1, and are refused, not read as those)
    if content.get("format") != LAYOUT_FORMAT or not isinstance(version, int) or isinstance(version, bool) \
            or version not in READ_VERSIONS:
        raise ValueError(f"format {str(content.get('format'))[:40]!r} version {str(version)[:20]}, expected "
                         f"{LAYOUT_FORMAT!r} version {' or '.join(map(str, READ_VERSIONS))}")
    entries = content["leaves"]
    if not isinstance(entries, list):
        raise ValueError("'leaves' is not a list")
    type_text = content["type"]
    if not isinstance(type_text, str):
        raise ValueError("'type' is not a string")
    leaves, keys, dtypes, forms = [], [], [], []
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"leaf {k} is not an object")
        where = f"leaf {k} ({str(entry.get('path'))[:80]})"
        leaf, form = _leaf_entry(entry, where, version)
        leaves.append(leaf)
        keys.append(_layout_keys(entry["keys"] if "keys" in entry else path_keys(leaf.path), where))
        dtypes.append(str(entry.get("dtype", "")))
        forms.append(form)
    description = content.get("tree")
    if version >= 2 and "tree" in content:  # (null: the tree None)
        check_description(description, len(leaves), MAX_KEY_DEPTH + 1)
        _check_paths(leaves, keys, described_paths(description))
        rebuild = _described_rebuild(description)
    else:  # version 1, or a hand-made version 2 without a tree: nested dicts and lists by keys
        rebuild = nested_rebuild(keys)
    identity = content.get("data") if version >= 2 else None
    if version >= 2:
        _check_identity_entry(identity)
    extra = {name: content[name] for name in ("safetensors",) if name in content}
    if "safetensors" in extra:
        _check_safetensors_entry(extra["safetensors"])
    return LayoutFile(Layout(tuple(leaves), tuple(range(len(leaves))), rebuild), type_text, tuple(dtypes),
                      tuple(keys), tuple(forms), description, identity, version, path, extra)


def _check_paths(leaves: list[Leaf], keys: list[tuple], described: list[str]) -> None:
    """A version 2 file's leaves name the key paths its tree puts them at, and their keys are those
    paths' keys (ValueError naming the first leaf that disagrees)."""
    for k, (leaf, leaf_keys, there) in enumerate(zip(leaves, keys, described)):
        if leaf.path != there:
            raise ValueError(f"leaf {k}: path {leaf.path[:80]!r}, but the tree puts {there[:80]!r} there")
        if list(leaf_keys) != path_keys(leaf.path):
            raise ValueError(f"leaf {k}: keys {str(list(leaf_keys))[:80]} are not those of its path {leaf.path[:80]!r}")


def _described_rebuild(description: Any):
    return lambda values: build_described(description, values)


def _lengths(value: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in value):
        raise ValueError(f"{where}: {what} {str(value)[:80]} is not a list of lengths (integers ≥ 0)")
    return tuple(value)


def _leaf_entry(entry: dict, where: str, version: int) -> tuple[Leaf, sd.Form | None]:
    """A leaf of a layout file and its form; ValueError saying what disagrees."""
    path = entry["path"]
    if not isinstance(path, str):
        raise ValueError(f"{where}: the path is not a string")
    shape = _lengths(entry["shape"], "shape", where)
    bound = entry.get("bound")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
        raise ValueError(f"{where}: bound {str(bound)[:40]} is not an integer")
    encoding = entry.get("encoding")
    if encoding is not None:
        if bound is not None:
            raise ValueError(f"{where}: both a bound and an encoding")
        if encoding not in ("f64", "f32", "bf16"):
            raise ValueError(f"{where}: encoding {str(encoding)[:20]!r} (expected f64, f32 or bf16)")
    dtype = entry.get("dtype", "")
    if not isinstance(dtype, str):
        raise ValueError(f"{where}: dtype {str(dtype)[:40]} is not a string")
    leaf = Leaf(path, shape, bound)
    stored = _ENCODINGS[encoding] if encoding is not None else None
    if version == 1:
        return leaf, _form_v1(dtype, leaf, where)
    kind = entry.get("kind", sd.KIND_VALUE)
    impl = entry.get("impl")
    if kind not in sd.KINDS:
        raise ValueError(f"{where}: kind {str(kind)[:20]!r} (expected one of {', '.join(sd.KINDS)})")
    if leaf.is_real and stored is None:
        raise ValueError(f"{where}: a real leaf without its encoding")
    return leaf, _form_v2(kind, dtype, impl, leaf, where)


def _form_v1(dtype: str, leaf: Leaf, where: str) -> sd.Form | None:
    """The form of a version 1 leaf: its dtype's value when the stored leaf holds it (signed
    integers were stored as values below 2^(K-1)), the stored view for a dtype not named there."""
    known = sd.dtype_named(dtype)
    if known is None:
        return None
    form = sd.form_of_dtype(known)
    assert form is not None  # (every dtype that has a name has a form)
    if form.is_real and form.kind == sd.KIND_VALUE:
        if not leaf.is_real:
            raise ValueError(f"{where}: dtype {dtype} for a leaf stored as idx[{leaf.bound}]")
        return form
    if leaf.is_real:
        raise ValueError(f"{where}: dtype {dtype} for a leaf stored as reals")
    if dtype.startswith("int"):
        limit = 2 ** (8 * known.itemsize - 1)
    elif dtype == "bool" or (dtype.startswith("uint") and dtype in ("uint8", "uint16", "uint32", "uint64")):
        limit = form.bound
    else:
        raise ValueError(f"{where}: dtype {dtype} in a version 1 layout file")
    if leaf.bound > limit:
        raise ValueError(f"{where}: dtype {dtype} for a leaf stored as idx[{leaf.bound}] (at most idx[{limit}])")
    return sd.Form(sd.KIND_VALUE, dtype, leaf.bound)


def _form_v2(kind: str, dtype: str, impl: Any, leaf: Leaf, where: str) -> sd.Form:
    """The form a version 2 leaf records, checked against its stored leaf."""
    if impl is not None and not isinstance(impl, str):
        raise ValueError(f"{where}: impl {str(impl)[:40]} is not a string")
    # (one answer per kind of leaf: a tree of a thousand leaves has a few kinds; what a form
    # checks of a shape is its rank, a single length, and the last length)
    shape = leaf.shape
    representative = shape if len(shape) <= 1 else (1,) * (len(shape) - 1) + (shape[-1],)
    form = _form_v2_of(kind, dtype, impl, leaf.bound, representative)
    if form is None:
        stored = f"idx[{leaf.bound}]" if not leaf.is_real else "reals"
        raise ValueError(f"{where}: dtype {dtype[:40]} kind {kind} for a leaf stored as {stored} "
                         f"of shape {list(leaf.shape)}")
    return form


@functools.lru_cache(maxsize=1024)
def _form_v2_of(kind: str, dtype: str, impl: str | None, bound: int | None,
                shape: tuple[int, ...]) -> sd.Form | None:
    try:
        return _checked_form_v2(kind, dtype, impl, Leaf("", shape, bound), "")
    except ValueError:
        return None


def _checked_form_v2(kind: str, dtype: str, impl: Any, leaf: Leaf, where: str) -> sd.Form:
    stored = f"idx[{leaf.bound}]" if not leaf.is_real else "reals"
    disagree = ValueError(f"{where}: dtype {dtype[:40]} kind {kind} for a leaf stored as {stored} "
                          f"of shape {list(leaf.shape)}")
    if kind == sd.KIND_KEY:
        if not isinstance(impl, str) or not impl or dtype != f"key<{impl}>" or leaf.bound != 2**32 or not leaf.shape:
            raise disagree
        return sd.key_form(impl, leaf.shape[-1])
    if impl is not None:
        raise ValueError(f"{where}: an impl for a leaf of kind {kind}")
    if kind == sd.KIND_PYTHON:
        if dtype == "float" and leaf.is_real and leaf.shape == ():
            return sd.Form(kind, dtype, None, Encoding.F64)
        if dtype == "bool" and leaf.bound == 2 and leaf.shape == ():
            return sd.Form(kind, dtype, 2)
        if dtype == "int" and ((leaf.shape == () and leaf.bound in (2**8, 2**16, 2**32, 2**64))
                               or (len(leaf.shape) == 1 and leaf.shape[0] >= 2 and leaf.bound == 2**64)):
            return sd.Form(kind, dtype, leaf.bound)
        raise disagree
    form = sd.form_of_dtype(sd.dtype_named(dtype)) if sd.dtype_named(dtype) is not None else None
    if form is None or form.kind != kind or form.dtype != dtype:
        raise disagree
    if form.is_real != leaf.is_real or (not leaf.is_real and leaf.bound != form.bound):
        raise disagree
    if form.trailing is not None and (not leaf.shape or leaf.shape[-1] != form.trailing):
        raise disagree
    return form


def _layout_keys(keys: Any, where: str) -> tuple[str | int, ...]:
    """A leaf's ``keys`` in a layout file: a list of strings and integers, at most
    :data:`MAX_KEY_DEPTH` of them (ValueError otherwise)."""
    if not isinstance(keys, list):
        raise ValueError(f"{where}: keys {str(keys)[:80]} is not a list")
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ValueError(f"{where}: the key {str(key)[:80]} is not a string or an integer")
    if len(keys) > MAX_KEY_DEPTH:
        raise ValueError(f"{where}: a key path {len(keys)} keys deep (at most {MAX_KEY_DEPTH})")
    return tuple(keys)


def _check_identity_entry(identity: Any) -> None:
    if not isinstance(identity, dict):
        raise ValueError("'data' (what identifies the data file) is missing or not an object")
    size = identity.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"'data': bytes {str(size)[:40]} is not a size")
    if "name" in identity and not isinstance(identity["name"], str):
        raise ValueError(f"'data': name {str(identity['name'])[:40]} is not a file name")
    if ("url" in identity) != ("tag" in identity):
        raise ValueError("'data': a url without a tag, or a tag without a url (the object's version: both or neither)")
    for name in ("url", "tag"):
        if name in identity and (not isinstance(identity[name], str) or not identity[name]):
            raise ValueError(f"'data': {name} {str(identity[name])[:40]} is not a string")
    for name in ("header_xxh3_128", "xxh3_128"):
        value = identity.get(name)
        if (name == "header_xxh3_128" or value is not None) and not _is_hex(value, 32):
            raise ValueError(f"'data': {name} {str(value)[:40]!r} is not 32 hex digits")


def _check_safetensors_entry(entry: Any) -> None:
    if not isinstance(entry, dict) or "metadata" not in entry:
        raise ValueError("'safetensors' is not an object with the source's metadata")
    metadata = entry["metadata"]
    if metadata is not None and (not isinstance(metadata, dict)
                                 or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ValueError("'safetensors': metadata is neither null nor an object of strings")


def _is_hex(value: Any, digits: int) -> bool:
    return isinstance(value, str) and len(value) == digits and all(c in "0123456789abcdef" for c in value)


def _data_header(data: str) -> tuple[Header, bytes, int, ObjectVersion | None]:
    """A data file's (or object's) header, its bytes, the size and (an object) its version (E9002
    for a FIFO or device: never blocks)."""
    source = open_bytes(data)
    try:
        size = source.size()
        header = read_header(source.header_stream(), data, size)
        header_bytes = bytearray(header.data_offset)
        source.read_at(memoryview(header_bytes), 0)
    finally:
        source.close()
    return header, bytes(header_bytes), size, version_of(source)


ObjectVersion = tuple[str, str]  # an object's URL and the version tag its store gave


def version_of(source: ByteSource) -> ObjectVersion | None:
    """The version of the object ``source`` reads (its URL and tag: for a checkpoint saved by
    several processes, its parts index's), None for a local file."""
    return (source.name, source.info.tag) if isinstance(source, StoreBytes) else None


def check_belongs(layout_file: LayoutFile, data: str | os.PathLike, *, xxh3_128: str | None = None) -> None:
    """Refuses (E9005, naming both files) a layout file that was not written with the data file
    ``data``: version 2 by its recorded size and header digest, version 1 by agreeing with the
    file's type, leaf encodings and size.

    The header and the size do not tell two trees apart whose leaves have the same encodings and
    byte total but other shapes. A caller that has the data file's whole ``xxh3_128`` (hex: it
    hashed the file anyway, as a verify or an adoption does) passes it, and a version 2 layout file
    that records the whole file's digest must then record that one."""
    data = os.fspath(data)
    header, header_bytes, size, version = _data_header(data)
    check_header_belongs(layout_file, data, header, header_bytes, size, xxh3_128=xxh3_128, version=version)


def check_header_belongs(layout_file: LayoutFile, data: str, header: Header, header_bytes: bytes, size: int, *,
                         xxh3_128: str | None = None, version: ObjectVersion | None = None,
                         verified_by: str | None = None) -> None:
    """:func:`check_belongs` of a data file whose header (parsed and as bytes) and size the caller
    read already (an object of a store, named ``data``). ``version``: the URL and version tag of
    the object read (the one its ranged reads are conditioned on); a layout that records another
    tag of that URL is another save's (:class:`OtherVersion`), whatever its header and size say —
    unless the layout records the whole data's xxh3_128 and it is the one the caller found
    (``xxh3_128``) or verifies every byte it reads against (``verified_by``): that digest proves
    the data the layout's save's (or the reads fail, E9013), and an object put again, damaged or
    not, is reported as what it is."""
    name = layout_file.path or "the layout"
    recorded_digest = (layout_file.identity or {}).get("xxh3_128")
    proofs = {d.lower() for d in (xxh3_128, verified_by) if d is not None}
    if recorded_digest is None or recorded_digest not in proofs:
        check_version(layout_file, data, version)
    problem = None
    if layout_file.identity is not None:
        recorded = layout_file.identity
        if recorded["header_xxh3_128"] != header_digest(header_bytes):
            problem = "it was written for a file with another header (type, count or leaf encodings)"
        elif size < recorded["bytes"]:  # the same save's data, cut short
            raise TruncatedError(f"{data}: truncated: {size} bytes, its layout file {name} records "
                                 f"{recorded['bytes']}")
        elif size > recorded["bytes"]:
            problem = f"it was written for a file of {recorded['bytes']} bytes, this one has {size}"
        elif xxh3_128 is not None and recorded.get("xxh3_128") not in (None, xxh3_128.lower()):
            problem = (f"it was written for a file whose xxh3_128 is {recorded['xxh3_128']}, this one's is "
                       f"{xxh3_128.lower()} (the same type and size: another save, of other values or of "
                       "leaves of other shapes)")
    if problem is None and layout_file.identity is None:  # (version 1: what can be checked)
        problem = _disagreement(layout_file, header, size)
    elif problem is None and layout_file.type_text != header.type_text:
        problem = (f"it was written for type {layout_file.type_text[:80]!r}, "
                   f"this file's type is {header.type_text[:80]!r}")
    if problem:
        raise MismatchError(f"{name}: not the layout of {data}: {problem}; it was left by another save "
                            "(save again, or give the right layout)")


def check_version(layout_file: LayoutFile, data: str, version: ObjectVersion | None) -> None:
    """Refuses (:class:`OtherVersion`) a layout recording another version of the object read.
    A layout written before versions were recorded, or for an object at another URL (the pair
    copied elsewhere, where the copy's tags are its own), is left to the header and size check."""
    recorded = layout_file.identity or {}
    if version is None or "tag" not in recorded or recorded.get("url") != version[0]:
        return
    if recorded["tag"] != version[1]:
        raise OtherVersion(f"{layout_file.path or 'the layout'}: not the layout of {data}: it was written for the "
                           f"version {recorded['tag']} of that object, the version read is {version[1]}: the "
                           "checkpoint was saved again while this read it (or a save of it was cut off between its "
                           "data and its layout, or the object was put again by other means): read it again, or "
                           "save it again")


def _disagreement(layout_file: LayoutFile, header: Header, size: int) -> str | None:
    """What a layout file and a data file's header disagree on (None when they agree)."""
    if layout_file.type_text != header.type_text:
        return f"it was written for type {layout_file.type_text[:80]!r}, this file's type is {header.type_text[:80]!r}"
    leaves = layout_file.layout.leaves
    if header.encodings is not None and len(header.encodings) != len(leaves):
        return f"it has {len(leaves)} leaves, this file's header lists {len(header.encodings)}"
    try:
        placement = Placement.of(layout_file.layout, header.encodings, from_header=True)
    except PskdError as e:
        return e.message
    needed = header.data_offset + header.count * placement.sample_bytes
    if needed != size:
        return f"its leaves take {needed} bytes with this header, the file has {size}"
    return None


def find_layout_file(checkpoint: str | os.PathLike) -> LayoutFile | None:
    """The layout file beside a ``params`` checkpoint, proven to belong to it (E9005 naming both
    files when it does not), or None when there is none (beside a closed-type file, a file there
    that is not a layout file is passed over).

    Its name follows from the checkpoint's whole name (:func:`pskd_jax._os.names.layout_path_for`);
    where none stands there, a layout file under the name an earlier version gave it
    (:func:`~pskd_jax._os.names.older_layout_paths`) is read when it proves to belong to the
    checkpoint, and passed over otherwise (it may be another file's, or a user's own).

    Where a save of the checkpoint was cut off between putting its layout file and its data in
    place (:func:`pskd_jax._os.locks.commit_cut_short`), the pair of the save whose data stands
    there is read: the layout file in place when the data is the new one, else the old layout
    file the save kept (:func:`~pskd_jax._os.names.layout_before`), or none where the old save had
    none. A look-up of an object that a save of it overtakes (the layout object read, then another
    version of the data: :class:`OtherVersion`) is made again, as a local file's is (E9005 after
    :data:`~pskd_jax.format.one_save.ATTEMPTS`). The layout file returned remembers the look-up
    (:attr:`LayoutFile.looked_up`): a reader that finds the checkpoint saved again since looks the
    pair up again. Nothing is written."""
    return _find_layout_file(checkpoint, again=True)


def layout_beside(checkpoint: str | os.PathLike) -> LayoutFile | None:
    """:func:`find_layout_file` for a caller that reads the pair again itself when a save of an
    object overtakes the look-up (a restore, a reader's template check): one look-up, its
    :class:`OtherVersion` raised at once."""
    return _find_layout_file(checkpoint, again=False)


def _find_layout_file(checkpoint: str | os.PathLike, *, again: bool) -> LayoutFile | None:
    """:func:`find_layout_file`, an object's look-up read again while saves overtake it (``again``)."""
    # E9018 naming the data's own URL when the toolkit cannot serve it, or without the client
    resolve(checkpoint)
    candidate = layout_path_for(checkpoint)
    if is_object_url(candidate):  # a layout object beside the object (older names are not looked for)
        store, where = resolve(candidate)
        if store.info(where.key) is None:
            return None
        found: LayoutFile | None = _read_for(candidate, checkpoint, None, again=again)
    else:
        data = locate(checkpoint).path
        found = _of_one_save(data, lambda: _found_beside(checkpoint, data, candidate))
    return None if found is None else dataclasses.replace(found, looked_up=(os.fspath(checkpoint), None, None))


def _found_beside(checkpoint: str | os.PathLike, data: str, candidate: str) -> LayoutFile | None:
    """:func:`find_layout_file` of the local data file ``data``, its proof made by the path."""
    cut = commit_cut_short(data)
    if cut is not None and cut.data is None:
        raise MismatchError(f"{candidate}: may not be the layout of {data}: a save of {data} was cut off between "
                            f"putting its layout file and its data in place ({save_lock(data)} says so, without "
                            "saying which data is the new one), so the two may come from different saves and "
                            "neither is used: save it again, or give a layout you trust (layout=)")
    if cut is not None and not cut.committed(data):  # the old save's data: its own layout, if any
        if cut.before:
            kept = layout_before(data)
            if _regular(kept):
                try:
                    found = _beside(checkpoint, kept)
                except PskdError:
                    if _regular(kept):
                        raise
                else:
                    if found is not None or _regular(kept):
                        return found
            # (else put back in place since, by the next writer of the checkpoint: read there)
        elif cut.layout:
            return _older(checkpoint)  # (the layout in place is the new save's; the old had none there)
    if os.path.exists(locate(candidate).path):
        return _beside(checkpoint, candidate)
    return _older(checkpoint)


def _beside(checkpoint: str | os.PathLike, layout: str) -> LayoutFile | None:
    """The layout file ``layout`` standing beside ``checkpoint`` (at its name, or kept by a commit
    cut short), as :func:`find_layout_file` reads it."""
    if not _data_header(os.fspath(checkpoint))[0].is_params:
        # A closed type has no layout file: a file there that is none (a user's notes) is
        # passed over; a layout file there is another save's, and refused naming both.
        try:
            found = _read_checked(layout, None)
        except PskdError:
            return None
        check_belongs(found, checkpoint)
        return found
    return _read_checked(layout, checkpoint)


def _older(checkpoint: str | os.PathLike) -> LayoutFile | None:
    """A layout file under a name an earlier version gave it, proven to belong to ``checkpoint``."""
    for older in older_layout_paths(checkpoint):
        if _regular(older):
            try:
                return _read_checked(older, checkpoint)
            except PskdError:
                continue
    return None


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


_HEAD_BYTES = 1 << 16
# The start of a layout file as the toolkit writes it: its format, version, type, then "data"
# (what identifies its data file, a flat object) before the leaves.
_HEAD = re.compile(r'\{\s*"format":\s*"' + LAYOUT_FORMAT + r'",\s*"version":\s*\d+,\s*"type":\s*"(?:[^"\\]|\\.)*",'
                   r'\s*"data":\s*(\{[^{}]*\})')


def _recorded_name(layout: str) -> str | None:
    """The data file's name a layout file records in its first bytes, as the toolkit writes them
    (None when they are not so: the caller then reads the whole file)."""
    try:
        with open_regular(layout, NotClosedError) as f:
            head = os.pread(f.fileno(), _HEAD_BYTES, 0).decode("utf-8", "replace")
    except (PskdError, OSError):
        return None
    match = _HEAD.match(head)
    if match is None:
        return None
    try:
        recorded = json.loads(match.group(1))
    except ValueError:
        return None
    name = recorded.get("name") if isinstance(recorded, dict) else None
    return name if isinstance(name, str) else None


def is_own_layout(layout: str | os.PathLike, data: str | os.PathLike) -> bool:
    """Whether the file ``layout`` is the toolkit's own layout file of the data file ``data``, the
    one a save of ``data`` may replace or remove: a regular file that reads as a layout file and
    either records ``data``'s name as the file it was written for (a save cut short between its
    layout and its data included) or proves to belong to the data file there now. Anything else —
    a user's notes, a data file, another file's layout, a directory — is not, and is left alone."""
    layout, data = os.fspath(layout), os.fspath(data)
    if not _regular(layout):
        return False
    if layout_path_for(data) == layout and _recorded_name(layout) == os.path.basename(data):
        return True  # (its own by the name it records: the rest need not be parsed)
    try:
        found = read_layout_file(layout)
    except PskdError:
        return False
    if not _regular(data):
        return False
    try:
        check_belongs(found, data)
    except (PskdError, OSError):
        return False
    return True


__all__ = [
    "LAYOUT_FORMAT",
    "LAYOUT_VERSION",
    "LayoutFile",
    "ObjectVersion",
    "OtherVersion",
    "check_belongs",
    "check_header_belongs",
    "check_version",
    "find_layout_file",
    "header_digest",
    "is_own_layout",
    "layout_after",
    "layout_beside",
    "layout_from_bytes",
    "looked_up_again",
    "read_layout_and_bytes",
    "read_layout_file",
    "version_of",
]
