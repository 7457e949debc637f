"""``pskd``: one command, a subcommand per job.

Each command group lives in a module beside this one and adds its subcommands with
``register(subparsers)``; a subcommand's handler takes the parsed arguments and returns the line
it prints. Errors of the toolkit print ``pskd: E9xxx: …`` on stderr and exit 1, no traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from absl import app
from absl.flags import argparse_flags

from . import checkpoint_commands, corpus_commands, data_commands, pipeline_commands
from pskd_jax import checkpoint
from pskd_jax.errors import PskdError, UsageError

COMMAND_GROUPS = (data_commands, pipeline_commands, checkpoint_commands, corpus_commands)


def make_parser() -> argparse_flags.ArgumentParser:
    parser = argparse_flags.ArgumentParser(
        prog="pskd", description="Data and checkpoint tools for .psk.d files."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def parse_flags(argv: Sequence[str]):
    return make_parser().parse_args(argv[1:])


def check_output_is_no_input(args) -> None:
    """Refuses (E9012) an output that is one of the command's input files (``pskd pack a.txt -o
    a.txt``): the output replaces its destination, and the input would be gone."""
    output = getattr(args, "output", None)
    if not isinstance(output, str) or not os.path.isfile(output):
        return
    inputs = [given for name, value in vars(args).items() if name != "output"
              for given in (value if isinstance(value, list) else [value]) if isinstance(given, str)]
    # A checkpoint's layout file is read beside it without being named: an input too.
    inputs += [checkpoint.layout_path_for(given) for given in inputs if given.endswith(".psk.d")]
    for given in inputs:
        try:
            same = os.path.isfile(given) and os.path.samefile(given, output)
        except OSError:
            continue
        if same:
            raise UsageError(f"{output}: the output is the input {given} itself, which writing it would replace; "
                             "give another output")


def main(args) -> None:
    try:
        check_output_is_no_input(args)
        for line in args.handler(args):
            print(line, flush=True)
    except PskdError as e:
        print(f"pskd: {e}", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:
        sys.stderr.close()  # a reader such as `head` stopped reading: not an error of ours
    except KeyboardInterrupt:
        print("pskd: interrupted", file=sys.stderr)
        sys.exit(130)


def run() -> None:
    """The console-script entry point."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
