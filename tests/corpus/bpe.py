"""Small Hugging Face tokenizers trained on the repository's own text (no download), for the
tests of the ``hf`` corpus tokenizer and of the Beam build."""

from __future__ import annotations

import glob
import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def repository_texts() -> list[str]:
    """The README and the package's Python sources: real text, with some non-ASCII."""
    paths = [ROOT / "README.md", *sorted(glob.glob(str(ROOT / "pskd_jax" / "**" / "*.py"), recursive=True))]
    return [pathlib.Path(p).read_text(encoding="utf-8") for p in paths]


def train_bpe(path: os.PathLike, *, vocab_size: int = 800, special_tokens: tuple[str, ...] = ("<|endoftext|>",)) -> str:
    """A byte-level BPE trained with the tokenizers trainer on :func:`repository_texts`, saved at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(repository_texts(), trainer)
    tokenizer.save(str(path))
    return str(path)


def word_level(path: os.PathLike, vocab: dict[str, int], special: tuple[str, ...] = ()) -> str:
    """A whitespace word-level tokenizer of exactly ``vocab`` (ids may leave gaps), ``special``
    added as special tokens (a token of ``vocab`` keeps its id; another gets the next), saved at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if special:
        tokenizer.add_special_tokens(list(special))
    tokenizer.save(str(path))
    return str(path)


def unigram(path: os.PathLike, pieces: list[str], special: tuple[str, ...] = ()) -> str:
    """A Unigram tokenizer (the SentencePiece kind: Metaspace pre-tokenizer, ``<unk>`` first) whose
    pieces are ``pieces`` (longer ones score higher), ``special`` added as special tokens, saved at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scored = [("<unk>", 0.0)] + [(p, -1.0 - 1.0 / len(p)) for p in pieces if p != "<unk>"]
    tokenizer = Tokenizer(models.Unigram(scored, unk_id=0))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    if special:
        tokenizer.add_special_tokens(list(special))
    tokenizer.save(str(path))
    return str(path)


def library_ids(path: os.PathLike, texts: list[str]) -> list[list[int]]:
    """What the library itself gives: ``encode_batch(texts, add_special_tokens=False)`` ids, special
    tokens written in a text encoded as text (``encode_special_tokens``), as a corpus encodes."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def documents(texts: list[str], size: int = 1500) -> list[str]:
    """The texts cut into documents of about ``size`` characters, plus a few made to be awkward."""
    docs = [t[i : i + size] for t in texts for i in range(0, len(t), size)]
    return docs + ["", " ", "données 🙂 tökén\n\twindow", "<|endoftext|> inside a text", "x" * 5000]


def write_jsonl(path: os.PathLike, docs: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
    return str(path)
