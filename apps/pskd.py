"""``pskd``: one command, a subcommand per job.

Each command group lives in a module beside this one and adds its subcommands with
``register(subparsers)``; a subcommand's handler takes the parsed arguments and returns the line
it prints. Errors of the toolkit print ``pskd: E9xxx: …`` on stderr and exit 1, no traceback; a
command line that does not parse prints one line ``pskd: E9012: …`` and exits 2, an unknown option
reported before missing arguments (``--help`` shows the usage and exits 0); ``pskd --version``
prints the version.
"""

from __future__ import annotations

import argparse
import contextvars
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from absl import app, flags
from absl.flags import argparse_flags

import pskd_jax
from pskd_jax._os import interrupts
from pskd_jax._os.files import read_whole
from pskd_jax._os.names import STANDARD_STREAM, layout_path_for, older_layout_paths
from pskd_jax.errors import PskdError, TruncatedError, UsageError
from pskd_jax.storage.urls import Location, locate

# The command groups, in the order ``pskd --help`` lists them: each a module beside this one and the
# commands its ``register`` adds. A command line that starts with a command imports that command's
# module only (and what it imports): ``pskd corpus build`` never loads the checkpoint code.
COMMAND_GROUPS = {
    "data_commands": ("chars", "encode", "decode", "pack", "lm-windows", "info", "diff", "export"),
    "pipeline_commands": ("pipeline",),
    "checkpoint_commands": ("verify", "convert"),
    "corpus_commands": ("corpus",),
}

USAGE_EXIT = 2  # argparse's status for a command line that does not parse


class _HeldBack:
    """While a whole command line is parsed: the missing-argument errors held back until the end,
    and the innermost (sub)command parser reached, which names an unknown option's command."""

    def __init__(self, parser: argparse_flags.ArgumentParser):
        self.missing: list[str] = []
        self.innermost = parser


_held_back: contextvars.ContextVar[_HeldBack | None] = contextvars.ContextVar("held_back", default=None)


def _is_missing(message: str) -> bool:
    """argparse's two errors for arguments not given (checked once the line is read)."""
    return message.startswith("the following arguments are required") or \
        (message.startswith("one of the arguments ") and message.endswith(" is required"))


class CommandParser(argparse_flags.ArgumentParser):
    """The parser of ``pskd`` and of each subcommand (argparse makes subparsers of its class):
    a usage error is the toolkit's E9012 in one line, not argparse's usage text.

    Errors come in the order a user fixes them: an unknown option first (at any level, whatever
    else is wrong), naming the subcommand it was given to, then missing arguments. argparse checks
    a subcommand's required arguments before the top level sees the options nobody knew;
    :meth:`parse_args` holds that check's error back until the options are known to be valid."""

    def parse_args(self, args=None, namespace=None):
        held = _HeldBack(self)
        token = _held_back.set(held)
        try:
            namespace, unknown = self.parse_known_args(args, namespace)
        finally:
            _held_back.reset(token)
        if unknown:
            held.innermost.error(f"unrecognized arguments: {' '.join(unknown)}")
        if held.missing:
            usage_error(held.missing[0])
        return namespace

    def parse_known_args(self, args=None, namespace=None):
        held = _held_back.get()
        if held is not None:
            held.innermost = self  # (a subcommand's parser is called from its parent's)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        text = f"{self.prog}: {message} (see {self.prog} --help)"
        held = _held_back.get()
        if held is not None and _is_missing(message):
            # argparse raises nothing after this check: it goes on to return what it parsed and
            # the options it did not know, and parse_args reports those first.
            held.missing.append(text)
            return  # type: ignore[misc]
        usage_error(text)


def usage_error(message: str) -> NoReturn:
    print(f"pskd: {UsageError(message)}", file=sys.stderr)
    sys.exit(USAGE_EXIT)


class VersionAction(argparse.Action):
    """``--version``: argparse's, reading the version only when asked (the package metadata
    costs tens of milliseconds to read, which every other command would pay)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show program's version number and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        sys.stdout.write(f"pskd {pskd_jax.__version__}\n")
        parser.exit()


def command_groups(command: str | None = None) -> list[str]:
    """The modules of the command groups to register: the one adding ``command``, or every group
    when ``command`` is None or no group adds it."""
    chosen = [group for group, commands in COMMAND_GROUPS.items() if command in commands]
    return chosen or list(COMMAND_GROUPS)


def make_parser(command: str | None = None) -> CommandParser:
    """The ``pskd`` parser: with ``command``, the parser of that command's group only (what its
    command line needs, and all a run of it imports); without, of every command."""
    parser = CommandParser(prog="pskd", description="Data and checkpoint tools for .psk.d files.")
    parser.add_argument("--version", action=VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in command_groups(command):
        importlib.import_module(f"pskd_jax.apps.{group}").register(subparsers)
    return parser


# Options whose value may begin with '-': argparse would take ``--encoding -,f32`` for two options.
DASH_VALUE_OPTIONS = ("--encoding",)
FLAGS_VALUE_OPTIONS = ("--beam_options", "--beam-options")  # (their value is other flags: always a value)


def join_dash_values(args: Sequence[str]) -> list[str]:
    """``--encoding -,f32,bf16`` → ``--encoding=-,f32,bf16``: a value that starts with '-' and holds
    a comma (no option does) is the value of the option before it; so is any value after
    ``--beam_options`` (``--beam_options "--runner=… --project=…"``: Beam's flags, not pskd's)."""
    joined: list[str] = []
    for arg in args:
        last = joined[-1] if joined else None
        dashed = arg.startswith("-")
        if (last in DASH_VALUE_OPTIONS and dashed and "," in arg) or (last in FLAGS_VALUE_OPTIONS and dashed):
            joined[-1] = f"{last}={arg}"
        else:
            joined.append(arg)
    return joined


MAX_FLAG_FILE_BYTES = 1 << 20  # far more than any list of options
MAX_FLAG_FILE_DEPTH = 32  # flag files naming flag files


_FLAG_FILE_PREFIXES = ("--flagfile=", "-flagfile=")


def _flag_file_names(args: Sequence[str]) -> list[str]:
    """The flag files a command line names, as absl finds them: ``--flagfile=F``, ``-flagfile=F``,
    or either followed by F, up to ``--``."""
    names, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            break
        if arg in ("--flagfile", "-flagfile") and rest:
            names.append(os.path.expanduser(rest.pop(0)))
        elif arg.startswith(_FLAG_FILE_PREFIXES):
            names.append(os.path.expanduser(arg.partition("=")[2].strip()))
    return names


def check_flag_files(names: Sequence[str], stack: tuple[str, ...] = ()) -> None:
    """Reads the flag files ``names``, and those they name, as absl will (E9012 naming one it
    could not use) before absl does: absl opens a file with ``open()`` and reads it whole, so a
    named pipe would block it, ``/dev/zero`` fill the memory, a byte that is not UTF-8 or a chain of
    a thousand files end in a traceback. A file already being read is skipped, as absl skips it."""
    for name in names:
        if not name or name in stack:
            continue
        if len(stack) == MAX_FLAG_FILE_DEPTH:
            raise UsageError(f"{name}: flag files nested deeper than {MAX_FLAG_FILE_DEPTH}")
        raw = read_whole(name, UsageError, what="as a flag file", limit=MAX_FLAG_FILE_BYTES)
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise UsageError(f"{name}: a flag file that is not UTF-8 (byte {e.start})") from None
        # (In a flag file absl takes only a line that starts --flagfile=F or -flagfile=F for one.)
        nested = [os.path.expanduser(line.partition("=")[2].strip()) for line in lines
                  if line.startswith(_FLAG_FILE_PREFIXES)]
        check_flag_files(nested, (*stack, name))


def parse_flags(argv: Sequence[str]):
    """The parsed command line. When it starts with a command (``pskd corpus build …``), argparse
    takes that word for the command whatever follows, so only its group is registered; anything
    else (``pskd --help``, an option before the command) is parsed by the parser of every command."""
    args = join_dash_values(argv[1:])
    try:
        check_flag_files(_flag_file_names(args))
    except PskdError as e:  # a flag file absl could not use: a usage error, as absl's own are
        usage_error(e.message)
    try:
        return make_parser(args[0] if args else None).parse_args(args)
    except flags.Error as e:  # absl's own flags (--flagfile naming no file, …)
        usage_error(f"pskd: {str(e).removeprefix('ERROR::').strip()}")
    except PskdError as e:  # a value's converter refused it (a URL the toolkit cannot serve): no traceback
        print(f"pskd: {e}", file=sys.stderr)
        sys.exit(1)


# The arguments that name files a command reads. Only they are compared with its output: every
# other one is a value (a type, an encoding, a number, the command's own name) that may happen to
# spell the output's name (``pskd export d.psk.d -o export`` writes a file named export).
INPUT_ARGUMENTS = ("input", "inputs", "file", "a", "b", "vocab", "tokenizer", "layout", "layout_b", "manifest",
                   "manifests")


def _place(given: str) -> Location | None:
    """Where a path or URL leads; None for one the toolkit cannot serve (the command reports it)."""
    try:
        return locate(given)
    except PskdError:
        return None


def _same_place(a: Location, b: Location) -> bool:
    """Whether two places are one file (however spelled: ``file://``, a relative path, a link,
    a hard link) or one object (the same store, bucket and key)."""
    if not (a.is_local and b.is_local):
        return a == b
    try:
        return os.path.isfile(a.path) and os.path.isfile(b.path) and os.path.samefile(a.path, b.path)
    except (OSError, ValueError):  # (a NUL in a path)
        return False


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def check_output_is_no_input(args) -> None:
    """Refuses (E9012) an output that is one of the command's input files (``pskd pack a.txt -o
    a.txt``, ``-o file:///…/a.txt``, an input's URL): the output replaces its destination, and the
    input would be gone."""
    output = getattr(args, "output", None)
    where = _place(output) if isinstance(output, str) and output != STANDARD_STREAM else None
    if where is None:
        return
    named = [given for name in INPUT_ARGUMENTS for given in _listed(getattr(args, name, None))
             if isinstance(given, str)]
    # A checkpoint's layout file is read beside it without being named (under the name this
    # version gives it, or an older one): an input too.
    beside = [layout for given in named for layout in (layout_path_for(given), *older_layout_paths(given))]
    for given in [*named, *beside]:
        place = _place(given)
        if place is not None and _same_place(place, where):
            raise UsageError(f"{output}: the output is the input {given} itself, which writing it would replace; "
                             "give another output")


def check_standard_output() -> None:
    """Refuses (E9003) to run with the standard output closed (``pskd info f >&-``): every command
    prints there, and a command that cannot say what it did or found has not done its job."""
    if sys.stdout is None:
        raise TruncatedError("-: cannot write the standard output: it is closed")


def print_line(line: str) -> None:
    """Prints a line of the command's output. A standard output that cannot take it (a full disk,
    ``> /dev/full``) is E9003; what is still buffered is then dropped, so that the interpreter's own
    flush at exit fails no second time with a traceback of its own."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        raise
    except OSError as e:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise TruncatedError(f"-: cannot write the standard output: {e.strerror or e}") from e


def main(args) -> None:
    interrupts.install()  # a Ctrl-C numpy swallows still stops the command before it writes its output
    try:
        check_standard_output()
        check_output_is_no_input(args)
        for line in args.handler(args):
            print_line(line)
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


__all__ = ["COMMAND_GROUPS", "CommandParser", "check_flag_files", "check_standard_output", "join_dash_values", "main",
           "make_parser", "parse_flags", "print_line", "run", "usage_error"]
