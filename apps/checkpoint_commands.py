"""The checkpoint commands: verify (digests) and convert (safetensors ↔ .psk.d)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from pskd_jax import checkpoint, storage
from pskd_jax._os.checks import counted, integer
from pskd_jax._os.digests import DIGESTS
from pskd_jax.checkpoint import integrity
from pskd_jax.errors import UsageError


def _given_digests(args) -> dict[str, str]:
    return {name: value for name, value in (("xxh3_128", args.xxh3_128), ("sha256", args.sha256)) if value}


def _verify(args) -> Iterator[str]:
    path = args.path
    given = _given_digests(args)
    if _is_directory(path):
        if given:
            raise UsageError("--xxh3-128/--sha256 check one file, not a directory")
        entries = checkpoint.verify_directory(path, step=args.step)
        for entry in entries:
            yield f"pskd: ok step {entry.step} {entry.file} {_described(entry.checkable_digests())}{_written(entry)}"
        yield f"pskd: {counted(len(entries), 'checkpoint')} verified in {path}"
        return
    if args.step is not None:
        raise UsageError("--step selects a step of a checkpoint directory")
    expected = given or checkpoint.recorded_digests(path)
    if not expected:
        found = {name: integrity.digest_of(path, name) for name in DIGESTS}
        yield (f"pskd: {path}: {_described(found)} (no recorded digest to compare: give --xxh3-128 or "
               "--sha256, or verify the checkpoint directory)")
        return
    checkpoint.verify_file(path, expected)
    yield f"pskd: ok {path} {_described(expected)}"


def _is_directory(path: str) -> bool:
    """A local directory, or a key prefix of a bucket with no object at the key itself and objects
    below it (a manager's prefix: its index is below it). A key with nothing at it nor below it is
    a missing file, which verifying names (never "0 checkpoints verified")."""
    where = storage.locate(path)
    if where.is_local:
        return os.path.isdir(where.path)
    store = storage.store_for(where)
    return not where.key or (store.info(where.key) is None and bool(store.list(where.key)))


def _written(entry: checkpoint.CheckpointEntry) -> str:
    """When the entry says its step was written (UTC), for entries that record it."""
    times = [f"{name} {value}" for name, value in (("started", entry.started), ("committed", entry.committed))
             if value is not None]
    return f" ({', '.join(times)})" if times else ""


def _described(digests: dict[str, str]) -> str:
    """``xxh3_128 HEX`` (and ``sha256 HEX`` when both were checked): what was checked."""
    return " ".join(f"{name} {value.lower()}" for name, value in digests.items())


def _convert(args) -> Iterator[str]:
    yield "pskd: " + checkpoint.convert(args.input, args.output, layout=args.layout, name=args.name)


def register(subparsers: argparse._SubParsersAction) -> None:
    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("verify", _verify, "Check checkpoints against the digest (xxh3_128, or sha256) recorded when "
                                   "they were written; prints the algorithm checked.")
    p.add_argument("path", metavar="DIR|FILE.psk.d", help="a checkpoint directory or bucket prefix (every step), "
                   "or one file or object")
    p.add_argument("--step", type=integer, metavar="N", help="only this step of the directory")
    p.add_argument("--xxh3-128", metavar="HEX", help="the xxh3_128 digest a single file must have "
                   "(as xxhsum -H2 prints it)")
    p.add_argument("--sha256", metavar="HEX", help="the sha256 digest a single file must have (as sha256sum prints it)")

    p = command("convert", _convert, "Convert between .safetensors and .psk.d, bit for bit.")
    p.add_argument("input", metavar="IN", help="a .safetensors or .psk.d file, or an object URL (s3://…)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="a .psk.d or .safetensors file, or an "
                   "object URL (written in one put)")
    p.add_argument("--layout", metavar="LAYOUT.json", help="the layout of a params checkpoint "
                   "(default: the NAME.layout.json beside it)")
    p.add_argument("--name", metavar="NAME", help="the params type name of a new checkpoint (default Params)")


__all__ = ["register"]
