"""Where a file or an object lives: a local path or a URL, parsed once into a :class:`Location`.

Every place of the toolkit that takes a path takes a URL too: ``s3://bucket/key``,
``gs://bucket/key``, ``memory://bucket/key`` (one process's memory, for tests), ``file:///path``
or a plain path. A string that starts like a URL (``scheme://``) with a scheme the toolkit cannot
serve is refused (E9018 naming it), and so is one that starts with a scheme and a colon but not
``//`` (``s3:/x``, ``gs:key``): neither ever becomes a local directory named ``scheme:``. A local
file whose name holds a colon in its first part is written ``./name``.
See ``docs/storage.md``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse

from pskd_jax.errors import StorageError
from pskd_jax.storage.config import redact

OBJECT_SCHEMES = ("s3", "gs", "memory")  # served by the object-store client
SCHEMES = ("file", *OBJECT_SCHEMES)
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")  # how every URL starts, "//" or not
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]*)@")  # (user:password@ before a host or bucket)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")  # S3's and GCS's common rule (3 to 63 characters)
MAX_KEY_BYTES = 1024  # the longest key S3 and GCS store (in UTF-8); a longer one is a server's 400


@dataclasses.dataclass(frozen=True)
class Location:
    """A parsed place: ``scheme`` (``"file"`` for a local path), ``bucket`` (empty for a local
    path) and ``key`` (the object's key within its bucket, without a leading slash, or the local
    path as given). ``url`` is what messages show.

    >>> where = locate("s3://data/corpus/shards.json")
    >>> where.scheme, where.bucket, where.key, where.is_local
    ('s3', 'data', 'corpus/shards.json', False)
    >>> where.parent().child("shard-00000.psk.d").url
    's3://data/corpus/shard-00000.psk.d'
    >>> locate("out/ckpt.psk.d").is_local, locate("file:///tmp/x").key
    (True, '/tmp/x')
    """

    scheme: str
    bucket: str
    key: str

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def url(self) -> str:
        return self.key if self.is_local else f"{self.scheme}://{self.bucket}/{self.key}"

    @property
    def path(self) -> str:
        """The local path of a local location (E9018 for an object's)."""
        if not self.is_local:
            raise StorageError(f"{self.url}: an object in a store, not a local file")
        return self.key

    @property
    def name(self) -> str:
        """The last part of the key or path."""
        return os.path.basename(self.key.rstrip("/")) if self.is_local else self.key.rstrip("/").rpartition("/")[2]

    def child(self, name: str) -> Location:
        """The location of ``name`` inside this one (a directory, or a key prefix)."""
        if self.is_local:
            return Location("file", "", os.path.join(self.key, name))
        base = self.key.rstrip("/")
        return Location(self.scheme, self.bucket, f"{base}/{name}" if base else name)

    def parent(self) -> Location:
        """The directory (or key prefix) that holds this location."""
        if self.is_local:
            return Location("file", "", os.path.dirname(self.key) or ".")
        return Location(self.scheme, self.bucket, self.key.rstrip("/").rpartition("/")[0])

    def __str__(self) -> str:
        return self.url


def is_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` is written as a URL (``scheme:…``), served or not, well formed or not: such a
    string is never a local path (:func:`locate` refuses what it cannot serve).

    >>> is_url("gs://b/k"), is_url("ftp://host/x"), is_url("s3:x"), is_url("data/x.psk.d"), is_url("./a:b")
    (True, True, True, False, False)
    """
    return isinstance(text, str) and _SCHEME.match(text) is not None


def is_object_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` names an object in a store (``s3://``, ``gs://``, ``memory://``)."""
    match = _URL.match(text) if isinstance(text, str) else None
    return match is not None and match.group(1).lower() in OBJECT_SCHEMES


def locate(place: str | os.PathLike[str] | Location) -> Location:
    """The :class:`Location` of a path or URL; E9018 naming it when it is a URL the toolkit cannot
    serve, or an object URL without a bucket or with a key no store accepts. The message shows no
    credential: not the user-info of a URL (``s3://KEY:SECRET@bucket/…``, which no store of the
    toolkit takes), nor a secret the environment or the AWS profile holds (:func:`redact`)."""
    if isinstance(place, Location):
        return place
    if not isinstance(place, str):
        return Location("file", "", os.fspath(place))
    try:
        return _locate(place)
    except StorageError as e:
        raise StorageError(_without_credentials(place, e.message)) from None


def _without_credentials(place: str, message: str) -> str:
    """``message`` (about ``place``) with the URL's user-info and every known secret as ``***``."""
    userinfo = _USERINFO.match(place)
    if userinfo is not None and userinfo.group(1):
        message = message.replace(userinfo.group(1) + "@", "***@")
    return redact(message)


def _locate(place: str) -> Location:
    match = _URL.match(place)
    if match is None:
        started = _SCHEME.match(place)
        if started is not None:
            raise StorageError(f"{place}: starts like a URL ({started.group(1)}:) but not with "
                               f"{started.group(1)}://; write s3://bucket/key (or gs://, memory://, file:///path), "
                               f"or ./{place} for a local file whose name holds a colon")
        return Location("file", "", place)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return Location("file", "", _file_path(place, rest))
    if scheme not in OBJECT_SCHEMES:
        raise StorageError(f"{place}: the toolkit cannot serve {scheme}:// URLs; it reads and writes "
                           f"{', '.join(s + '://' for s in SCHEMES)} and plain paths")
    bucket, _, key = rest.partition("/")
    _check_bucket(place, scheme, bucket)
    return Location(scheme, bucket, _checked_key(place, key))


def _file_path(place: str, rest: str) -> str:
    host, slash, path = rest.partition("/")
    if host not in ("", "localhost"):
        raise StorageError(f"{place}: a file:// URL names a file of this machine (file:///path), not of "
                           f"host {host!r}")
    return urllib.parse.unquote(slash + path)


def _check_bucket(place: str, scheme: str, bucket: str) -> None:
    if scheme == "memory":
        if not bucket:
            raise StorageError(f"{place}: a memory:// URL names a store first (memory://NAME/key)")
        return
    if not _BUCKET.match(bucket):
        raise StorageError(f"{place}: {bucket!r} is not a bucket name (3 to 63 lower-case letters, digits, "
                           "dots, hyphens or underscores, starting and ending with a letter or digit)")


def _checked_key(place: str, key: str) -> str:
    """A key without empty, ``.`` or ``..`` parts (which stores normalise away or refuse), and
    without a trailing slash except for a whole-bucket prefix."""
    stripped = key.rstrip("/")
    parts = stripped.split("/") if stripped else []
    bad = [part for part in parts if part in ("", ".", "..")]
    if bad:
        raise StorageError(f"{place}: the key {key!r} has an empty, '.' or '..' part; write each part "
                           "of an object's key once (no '//')")
    if any(ord(c) < 32 or ord(c) == 127 for c in stripped):  # (the client refuses DEL as it does the rest)
        raise StorageError(f"{place}: the key holds a control character")
    try:
        stripped.encode("utf-8")
    except UnicodeEncodeError:  # (a name of bytes the file system's encoding did not decode: surrogates)
        raise StorageError(f"{place}: the key is not UTF-8 text (it holds bytes that do not decode); object keys "
                           "are UTF-8") from None
    check_key_length(place, stripped)
    return stripped


def check_key_length(url: str, key: str) -> None:
    """Refuses (E9018 naming ``url``) a key longer than S3 and GCS store, before any request: the
    server's refusal would come only after a multipart upload's data was sent, in its own words.
    A key made from a prefix (a step's, a shard's) is checked where it is used, by the store. Like
    every message about a URL, it shows no credential (see :func:`locate`)."""
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_BYTES:
        raise StorageError(_without_credentials(url, f"{url}: the key is {size} bytes long in UTF-8; S3 and GCS store "
                                                     f"keys of at most {MAX_KEY_BYTES} bytes: write a shorter prefix "
                                                     "or name"))


__all__ = ["MAX_KEY_BYTES", "OBJECT_SCHEMES", "SCHEMES", "Location", "check_key_length", "is_object_url", "is_url",
           "locate"]
