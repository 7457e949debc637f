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

Prints both and their ratio, by wall time and by this process's CPU time (everything runs on the
one thread, so CPU time is the same work, less what other processes on a shared machine take);
target >= 0.8. Also prints ``encode_batch_fast`` (the library's call without offsets, which the
build uses) for reference.
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
from pskd_jax.corpus import BuildOptions  # noqa: E402

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
        names = ("build", "encode_batch", "encode_batch_fast")
        wall = dict.fromkeys(names, float("inf"))
        cpu = dict.fromkeys(names, float("inf"))
        tokens = {}
        for _ in range(args.rounds):
            for name in names:
                w0, c0 = time.perf_counter(), time.process_time()
                if name == "build":
                    result = corpus.build_shard(source, shard, BuildOptions(tokenizer=tokenizer))
                    count = result.entry.tokens - result.entry.documents
                else:
                    call, count = getattr(library, name), 0
                    for i in range(0, len(texts), BATCH):
                        count += sum(len(e.ids) for e in call(texts[i : i + BATCH], add_special_tokens=False))
                wall[name] = min(wall[name], time.perf_counter() - w0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
                tokens[name] = count
        assert tokens["build"] == tokens["encode_batch"] == tokens["encode_batch_fast"], tokens
        print(f"hf build: {text_mb:.1f} MB of text in {len(texts)} documents, BPE of {args.vocab} ids, "
              f"{tokens['build']} tokens, one thread; MB/s of text by wall time (by this process's CPU time)")
        what = {"build": "build_shard (read, parse, encode, write, sha256)",
                "encode_batch": f"encode_batch (texts in memory, batches of {BATCH})",
                "encode_batch_fast": "encode_batch_fast (the same)"}
        for name in names:
            print(f"  {what[name]:52s} {text_mb / wall[name]:6.2f} MB/s ({text_mb / cpu[name]:.2f})")
        for base in ("encode_batch", "encode_batch_fast"):
            target = " [target >= 0.8]" if base == "encode_batch" else ""
            print(f"  build / {base} = {wall[base] / wall['build']:.2f}x by wall time, "
                  f"{cpu[base] / cpu['build']:.2f}x by CPU time{target}")
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
