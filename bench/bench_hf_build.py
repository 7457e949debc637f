"""Benchmark: a corpus build with a BPE ``tokenizer.json``, one worker, against the tokenizer's own
``encode_batch`` on the same text, side by side in one run.

    python bench/bench_hf_build.py [--mb 10] [--vocab 16000] [--rounds 5]

Trains a byte-level BPE of ``--vocab`` ids with the ``tokenizers`` trainer on the Python standard
library's ``.py`` sources (no download), writes ``--mb`` megabytes of JSONL of documents of about
3 KB cut from the same sources, then measures, on one thread (``TOKENIZERS_PARALLELISM=false``),
in ``--rounds`` short rounds that alternate the two (a burst of other work on a shared machine then
slows both alike), the best round of each:

- build: :func:`build_shard` of the JSONL file in this process (read, parse, encode, write the
  shard, sha256), in MB of document text per second;
- encode_batch: the library's ``encode_batch(texts, add_special_tokens=False)`` over the same
  documents already in memory, in batches of 1,000, the same MB of text per second.

Prints both and their ratio; target >= 0.8. Also prints ``encode_batch_fast`` (the library's call
without offsets, which the build uses) for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_corpus import MB, make_jsonl, stdlib_texts  # noqa: E402

from pskd_jax import corpus  # noqa: E402

BATCH = 1000


def train(path: str, texts: list[str], vocab: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(path)
    return path


def read_texts(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=10, help="megabytes of JSONL")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; the best of each side counts")
    parser.add_argument("--vocab", type=int, default=16000, help="BPE vocabulary size")
    args = parser.parse_args()
    from tokenizers import Tokenizer as Library

    d = tempfile.mkdtemp(prefix="bench_hf_build.")
    try:
        path = train(os.path.join(d, "tokenizer.json"), stdlib_texts(), args.vocab)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, both sides (read at each call)
        [source] = make_jsonl(d, 1, args.mb * MB)
        texts = read_texts(source)
        text_mb = sum(len(t.encode("utf-8")) for t in texts) / MB
        tokenizer = corpus.Tokenizer.from_file(path)
        library = Library.from_file(path)
        library.encode_special_tokens = True  # as the corpus encodes (the stdlib's text holds none)
        shard = os.path.join(d, "shard.psk.d")
        best = {"build": float("inf"), "encode_batch": float("inf"), "encode_batch_fast": float("inf")}
        tokens = {}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            result = corpus.build_shard(source, shard, tokenizer=tokenizer)
            best["build"] = min(best["build"], time.perf_counter() - t0)
            tokens["build"] = result.entry.tokens - result.entry.documents
            for name in ("encode_batch", "encode_batch_fast"):
                call = getattr(library, name)
                t0 = time.perf_counter()
                count = 0
                for i in range(0, len(texts), BATCH):
                    count += sum(len(e.ids) for e in call(texts[i : i + BATCH], add_special_tokens=False))
                best[name] = min(best[name], time.perf_counter() - t0)
                tokens[name] = count
        assert tokens["build"] == tokens["encode_batch"] == tokens["encode_batch_fast"], tokens
        rate = {k: text_mb / v for k, v in best.items()}
        print(f"hf build: {text_mb:.1f} MB of text in {len(texts)} documents, BPE of {args.vocab} ids, "
              f"{tokens['build']} tokens, one thread")
        print(f"  build_shard (read, parse, encode, write, sha256): {rate['build']:.2f} MB/s")
        print(f"  encode_batch (texts in memory, batches of {BATCH}): {rate['encode_batch']:.2f} MB/s  "
              f"[encode_batch_fast: {rate['encode_batch_fast']:.2f} MB/s]")
        ratio = rate["build"] / rate["encode_batch"]
        print(f"  build / encode_batch = {ratio:.2f}x [target >= 0.8]; "
              f"build / encode_batch_fast = {rate['build'] / rate['encode_batch_fast']:.2f}x")
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
