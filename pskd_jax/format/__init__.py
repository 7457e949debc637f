"""The ``.psk.d`` format: sample types, encodings, pytree layouts, the header, reading and writing.

Never imports JAX. The byte layout and the type grammar: ``docs/format.md``; how a type maps to a
pytree: ``docs/pytrees.md``; what may reach a file: ``docs/exactness.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pskd_jax._os.lazy import lazy_names

if TYPE_CHECKING:
    from pskd_jax.format.encodings import Encoding, Rounding, index_dtype, round_f64_to_bf16, to_f64
    from pskd_jax.format.header import MAGIC, Header, encode_header, read_header
    from pskd_jax.format.layout import Layout, Leaf
    from pskd_jax.format.reader import Reader
    from pskd_jax.format.sample_type import format_type, header_text, parse_type
    from pskd_jax.format.source import ACCESS_MODES, Source
    from pskd_jax.format.tree import flatten, layout_of_template
    from pskd_jax.format.writer import Writer, WriteResult, write, write_encoded, write_stream
else:  # each name imported from its module when first asked for (see pskd_jax._os.lazy)
    __getattr__, __dir__ = lazy_names(__name__, {
        "pskd_jax.format.encodings": ("Encoding", "Rounding", "index_dtype", "round_f64_to_bf16", "to_f64"),
        "pskd_jax.format.header": ("MAGIC", "Header", "encode_header", "read_header"),
        "pskd_jax.format.layout": ("Layout", "Leaf"),
        "pskd_jax.format.reader": ("Reader",),
        "pskd_jax.format.sample_type": ("format_type", "header_text", "parse_type"),
        "pskd_jax.format.source": ("ACCESS_MODES", "Source"),
        "pskd_jax.format.tree": ("flatten", "layout_of_template"),
        "pskd_jax.format.writer": ("Writer", "WriteResult", "write", "write_encoded", "write_stream"),
    })

__all__ = [
    "ACCESS_MODES",
    "MAGIC",
    "Encoding",
    "Header",
    "Layout",
    "Leaf",
    "Reader",
    "Rounding",
    "Source",
    "WriteResult",
    "Writer",
    "encode_header",
    "flatten",
    "format_type",
    "header_text",
    "index_dtype",
    "layout_of_template",
    "parse_type",
    "read_header",
    "round_f64_to_bf16",
    "to_f64",
    "write",
    "write_encoded",
    "write_stream",
]
