"""The data commands: chars, encode, decode, pack, lm-windows, info, diff, export."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from pskd_jax import checkpoint, corpus, data
from pskd_jax._os.checks import counted, integer
from pskd_jax.data.info import iter_info_lines
from pskd_jax.errors import UsageError
from pskd_jax.format import Layout
from pskd_jax.format.placement import encoding_labels


def _wrote(args, line: str) -> Iterator[str]:
    """The summary line of a command that wrote ``args.output``; none when the output was the
    standard output (``-o -``), which holds the text itself."""
    if args.output != data.STANDARD_STREAM:
        yield line


def _binary_output(args) -> None:
    """Refuses ``-o -`` for an output that is not text (a .psk.d file): E9012."""
    if args.output == data.STANDARD_STREAM:
        raise UsageError(f"pskd {args.command}: -o -: the output is a binary .psk.d file, which is not written to "
                         "the standard output; give a file name")


def _chars(args) -> Iterator[str]:
    vocab, characters = data.char_vocab_file(args.input)
    data.write_vocab(args.output, vocab)
    yield from _wrote(args, f"pskd: wrote {args.output} ({len(vocab)} distinct characters over {characters} "
                            "characters of text)")


def _encode(args) -> Iterator[str]:
    if args.tokenizer is not None:  # a tokenizer.json (or a vocabulary file)
        tokenizer = corpus.Tokenizer.from_file(args.tokenizer)
        count = corpus.encode_text_file(args.input, tokenizer, args.output)
        yield from _wrote(args, f"pskd: wrote {args.output} ({count} tokens over a vocabulary of {tokenizer.size} "
                                "tokens)")
        return
    vocab = data.read_vocab(args.vocab)
    count = data.encode_file(args.input, args.vocab, args.output)  # the file, so that errors name it
    yield from _wrote(args, f"pskd: wrote {args.output} ({count} tokens over a vocabulary of {len(vocab)} tokens)")


def _decode(args) -> Iterator[str]:
    if args.tokenizer is not None:
        tokenizer = corpus.Tokenizer.from_file(args.tokenizer)
        count, characters = corpus.decode_tokens_file(args.input, tokenizer, args.output)
        yield from _wrote(args, f"pskd: wrote {args.output} ({characters} characters from {count} tokens)")
        return
    vocab = data.read_vocab(args.vocab)
    count = data.decode_file(args.input, args.vocab, args.output)  # the file, so that errors name it
    yield from _wrote(args, f"pskd: wrote {args.output} ({count} characters from a vocabulary of {len(vocab)} tokens)")


def _pack(args) -> Iterator[str]:
    _binary_output(args)
    layout = Layout.of_type(args.type)
    encodings = data.parse_encodings(args.encoding, layout)
    result = data.pack_file(args.input, args.type, args.output, encodings=encodings,
                            round_to_encoding=args.round)
    labels = "" if result.version == 1 else ", encodings " + " ".join(encoding_labels(layout.leaves, result.encodings))
    yield f"pskd: wrote {args.output} ({counted(result.count, 'sample')} of type {result.type_text}{labels})"
    for report in result.rounding:
        yield f"pskd: {report.describe()}"


def _vocab_size(text: str) -> int:
    """``--vocab`` of lm-windows: a number V, or a vocabulary file (what ``chars`` writes and
    ``encode`` reads), whose length is V. An integer (decimal digits, perhaps signed) is a number,
    checked by lm-windows; anything else names a file."""
    if text.isascii() and text.lstrip("+-").isdigit() and len(text) - len(text.lstrip("+-")) <= 1:
        return int(text)
    return len(data.read_vocab(text))


def _lm_windows(args) -> Iterator[str]:
    _binary_output(args)
    result = data.lm_windows_file(args.input, args.output, vocab=_vocab_size(args.vocab), seq=args.seq,
                                     stride=args.stride)
    yield (f"pskd: wrote {args.output} ({counted(result.windows, 'window')} of type {result.type_text} "
           f"from {counted(result.tokens, 'token')})")


def _layout(args, path: str):
    """The layout file of a params file: --layout, else the ``NAME.layout.json`` written beside it
    (either proven to belong to ``path``: E9005 naming both files when it does not), or None."""
    if args.layout:
        return checkpoint.read_layout_file(args.layout, data=path)
    return checkpoint.find_layout_file(path)


def _info(args) -> Iterator[str]:
    # Streamed: the header's lines show before a bad sample's error. (A save that lands between the
    # layout's look-up and the reads has the pair looked up again by the library: open_with_layout.)
    return iter_info_lines(args.file, samples=args.samples, layout=_layout(args, args.file),
                           values=True if args.values else None)


SHOWN_PATHS = 20  # key paths listed per file when leaves are found in one file only


def _diff(args) -> Iterator[str]:
    # Each file through its own layout (--layout, --layout-b, else the NAME.layout.json beside
    # it): two checkpoints pair their leaves by key path. A layout named with --layout also reads
    # a B that has none of its own (when it belongs to B too: the same type and size); one found
    # beside A never does (B's order may differ).
    distance = _distance(args)
    how = " (flat, without the layout)" if distance.without_layout else ""
    yield (f"‖a − b‖₂ = {distance.diff_norm!r}  ‖a‖₂ = {distance.a_norm!r}  "
           f"relative {distance.relative!r}  over {distance.elements} real elements{how}")
    yield from _exact_lines(distance.exact)
    for name, paths in (("a", distance.only_a), ("b", distance.only_b)):
        if paths:
            yield f"only in {name} ({counted(len(paths), 'leaf', 'leaves')}, not compared): {_abridged(paths)}"
    for note in distance.notes:
        yield f"note: {note}"


def _distance(args) -> data.Distance:
    layout_a = _layout(args, args.a)
    layout_b = (checkpoint.read_layout_file(args.layout_b, data=args.b) if args.layout_b
                else checkpoint.find_layout_file(args.b))
    if layout_b is None and args.layout:
        checkpoint.check_belongs(layout_a, args.b)
        layout_b = layout_a
    # (The layout files themselves: they also say what each idx leaf's elements stand for.)
    return data.diff(args.a, args.b, layout_a=layout_a, layout_b=layout_b)


def _abridged(names) -> str:
    more = f" … and {len(names) - SHOWN_PATHS} more" if len(names) > SHOWN_PATHS else ""
    return " ".join(names[:SHOWN_PATHS]) + more


def _exact_lines(exact: data.Exact) -> Iterator[str]:
    """The idx leaves' line (integers, bools, bit patterns: compared exactly), when they hold any
    element, and the paired leaves of other dtypes, which were not compared."""
    if exact.elements:
        first = f"; first: {exact.first}" if exact.first else ""
        yield (f"idx leaves: {exact.differing} of {exact.elements} elements differ (integers, bools and bit "
               f"patterns, compared exactly){first}")
    if exact.not_compared:
        n = len(exact.not_compared)
        yield (f"not compared ({counted(n, 'leaf', 'leaves')} of one key path stored as other dtypes): "
               f"{_abridged(exact.not_compared)}")


def _export(args) -> Iterator[str]:
    count = data.export_json(args.file, args.output, layout=_layout(args, args.file))
    yield from _wrote(args, f"pskd: wrote {args.output} ({counted(count, 'sample')} as JSON)")


TEXT_OUTPUT_HELP = "the output file, or - for the standard output (written once complete)"


def _tokenizer_options(p: argparse.ArgumentParser) -> None:
    """--vocab VOCAB.json (one character a token) or --tokenizer tokenizer.json (Hugging Face)."""
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--vocab", metavar="VOCAB.json", help="a character vocabulary (pskd chars)")
    which.add_argument("--tokenizer", metavar="tokenizer.json",
                       help="a Hugging Face tokenizer.json (pip install 'pskd_jax[tokenizers]'); "
                            "the text is one document")


URL_HELP = "a local path, or an object's URL (s3://B/K, gs://B/K; its NAME.layout.json looked for beside it)"
LAYOUT_HELP = "the layout of a params file (default: the NAME.layout.json written beside it, if any)"


def register(subparsers: argparse._SubParsersAction) -> None:
    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("chars", _chars, "Build the character vocabulary of a UTF-8 text (a JSON array).")
    p.add_argument("input", metavar="INPUT.txt")
    p.add_argument("-o", "--output", required=True, metavar="VOCAB.json", help=TEXT_OUTPUT_HELP)

    p = command("encode", _encode, "Encode a text as whitespace-separated token indices.")
    p.add_argument("input", metavar="INPUT.txt")
    _tokenizer_options(p)
    p.add_argument("-o", "--output", required=True, metavar="TOKENS.txt", help=TEXT_OUTPUT_HELP)

    p = command("decode", _decode, "Decode token indices back to text (the inverse of encode).")
    p.add_argument("input", metavar="TOKENS.txt")
    _tokenizer_options(p)
    p.add_argument("-o", "--output", required=True, metavar="OUTPUT.txt", help=TEXT_OUTPUT_HELP)

    p = command("pack", _pack, "Pack one sample a line of text values into a .psk.d file.")
    p.add_argument("input", metavar="INPUT.txt")
    p.add_argument("--type", required=True, help="the sample type, e.g. '(idx[10][], ℝ[3])'")
    p.add_argument("--encoding",
                   help="f64, f32 or bf16 for every real leaf, or a comma list, one per leaf ('-' for an idx leaf)")
    p.add_argument("--round", action="store_true",
                   help="round reals to their encoding (half-even) and report the largest error")
    p.add_argument("-o", "--output", required=True, metavar="OUT.psk.d")

    p = command("lm-windows", _lm_windows, "Cut a token stream into language-modelling windows.")
    p.add_argument("input", metavar="TOKENS.txt")
    p.add_argument("--vocab", required=True, metavar="V|VOCAB.json",
                   help="the vocabulary size (tokens are below it), or the vocabulary file, whose length it is")
    p.add_argument("--seq", required=True, type=integer, metavar="T", help="window length")
    p.add_argument("--stride", type=integer, metavar="S", help="distance between window starts (default T)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.psk.d")

    p = command("info", _info, "Print a file's header and first samples; a checkpoint's leaves (key paths, "
                               "dtypes, shapes, storage).")
    p.add_argument("file", metavar="FILE.psk.d", help=URL_HELP)
    p.add_argument("--samples", type=integer, metavar="N",
                   help="how many samples to show (default 2; a checkpoint shows its values only when given)")
    p.add_argument("--values", action="store_true",
                   help="show a checkpoint's values too, as a restore gives them back (a data file shows them anyway)")
    p.add_argument("--layout", metavar="LAYOUT.json", help=LAYOUT_HELP)

    p = command("diff", _diff, "‖a − b‖₂ and relative to ‖a‖₂ over the real leaves of two files; their idx leaves "
                               "(integers, bools, bit patterns) compared exactly.")
    p.add_argument("a", metavar="A.psk.d", help=URL_HELP)
    p.add_argument("b", metavar="B.psk.d", help=URL_HELP)
    p.add_argument("--layout", metavar="LAYOUT.json",
                   help="the layout of a params file A, and of B when B has none beside it "
                        "(default: the NAME.layout.json written beside A)")
    p.add_argument("--layout-b", metavar="LAYOUT.json",
                   help="the layout of a params file B (default: the NAME.layout.json written beside it)")

    p = command("export", _export, "Write a file's samples as JSON, every real exact.")
    p.add_argument("file", metavar="FILE.psk.d", help=URL_HELP)
    p.add_argument("-o", "--output", required=True, metavar="OUT.json", help=TEXT_OUTPUT_HELP)
    p.add_argument("--layout", metavar="LAYOUT.json", help=LAYOUT_HELP)


__all__ = ["LAYOUT_HELP", "register"]
