"""The checkpoint commands: verify (digests) and convert (safetensors ↔ .psk.d)."""

from __future__ import annotations

import argparse
import os
from typing import Iterator

from pskd_jax import checkpoint, convert, manager
from pskd_jax.errors import BAD_USAGE, PskdError


def _verify(args) -> Iterator[str]:
    path = args.path
    if os.path.isdir(path):
        if args.sha256:
            raise PskdError(BAD_USAGE, "--sha256 checks one file, not a directory")
        entries = manager.verify_directory(path, step=args.step)
        for entry in entries:
            yield f"pskd: ok step {entry['step']} {entry['file']} sha256 {entry['sha256']}"
        yield f"pskd: {len(entries)} checkpoint{'s' if len(entries) != 1 else ''} verified in {path}"
        return
    if args.step is not None:
        raise PskdError(BAD_USAGE, "--step selects a step of a checkpoint directory")
    expected = args.sha256 or _recorded_digest(path)
    if expected is None:
        digest = checkpoint.file_sha256(path)
        yield (f"pskd: {path}: sha256 {digest} (no recorded digest to compare: give --sha256, or "
               "verify the checkpoint directory)")
        return
    checkpoint.verify_file(path, expected)
    yield f"pskd: ok {path} sha256 {expected.lower()}"


def _recorded_digest(path: str) -> str | None:
    """The digest the index of the file's directory records for it, if any."""
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.exists(os.path.join(directory, manager.INDEX)):
        return None
    for entry in manager.read_index(directory):
        if entry["file"] == name:
            return entry["sha256"]
    return None


def _convert(args) -> Iterator[str]:
    yield "pskd: " + convert.convert(args.input, args.output, layout=args.layout, name=args.name)


def register(subparsers: argparse._SubParsersAction) -> None:
    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("verify", _verify, "Check checkpoints against the sha256 recorded when they were written.")
    p.add_argument("path", metavar="DIR|FILE.psk.d", help="a checkpoint directory (every step) or one file")
    p.add_argument("--step", type=int, metavar="N", help="only this step of the directory")
    p.add_argument("--sha256", metavar="HEX", help="the digest a single file must have")

    p = command("convert", _convert, "Convert between .safetensors and .psk.d, bit for bit.")
    p.add_argument("input", metavar="IN", help="a .safetensors or .psk.d file")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="a .psk.d or .safetensors file")
    p.add_argument("--layout", metavar="LAYOUT.json", help="the layout of a params checkpoint "
                   "(default: the NAME.layout.json beside it)")
    p.add_argument("--name", metavar="NAME", help="the params type name of a new checkpoint (default Params)")
