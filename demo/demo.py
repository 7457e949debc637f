"""The demo: a real text through the data commands, run as a user runs them.

The text is the Python standard library's own ``.py`` sources, which every machine with Python
has: they go through ``pskd chars`` → ``pskd encode`` → ``pskd lm-windows`` → ``pskd info``, and the
windows are read back with the library to show a batch. ``demo.py --corpus`` takes the corpus
path instead: the text as JSONL documents → ``pskd corpus build`` → ``verify`` → ``info``, and
training on windows cut across the shards.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "demo"
TEXT_BYTES = 8 << 20  # 8 MB of source text: big enough to mean something, quick on 2 cores
SEQ = 64  # window length of the training data
STEPS_FIRST, STEPS_TOTAL = 150, 300  # trained in one process, then resumed in a fresh one


def gather_stdlib_text(destination: pathlib.Path, limit: int) -> int:
    """Concatenates UTF-8 ``.py`` files of the standard library, in sorted order, up to ``limit`` bytes."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    written = 0
    with open(destination, "wb") as out:
        for path in sorted(stdlib.rglob("*.py")):
            if "site-packages" in path.parts or written >= limit:
                continue
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue  # a few test files are deliberately not UTF-8
            out.write(data[: limit - written])
            written += min(len(data), limit - written)
    # The cut may have split a multi-byte character: drop any partial tail.
    text = destination.read_bytes().decode("utf-8", errors="ignore")
    destination.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def pskd(*args: str) -> None:
    """Runs one ``pskd`` command the way a user would, echoing it and timing it."""
    print("$ pskd " + " ".join(args), flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *args], check=True, cwd=ROOT)
    print(f"  ({time.perf_counter() - started:.2f} s)", flush=True)


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    text = OUT / "stdlib.txt"
    size = gather_stdlib_text(text, TEXT_BYTES)
    print(f"demo: {size / 1e6:.1f} MB of the standard library's Python sources in {text.relative_to(ROOT)}")
    rel = lambda p: str(p.relative_to(ROOT))  # noqa: E731 - paths as a user would type them
    vocab, tokens, windows = OUT / "vocab.json", OUT / "tokens.txt", OUT / "windows.psk.d"
    pskd("chars", rel(text), "-o", rel(vocab))
    if "--corpus" in sys.argv[1:]:
        return corpus_demo(text, vocab, rel)
    pskd("encode", rel(text), "--vocab", rel(vocab), "-o", rel(tokens))
    import json

    vocab_size = len(json.loads(vocab.read_text(encoding="utf-8")))
    pskd("lm-windows", "--vocab", str(vocab_size), "--seq", str(SEQ), rel(tokens), "-o", rel(windows))
    pskd("info", rel(windows), "--samples", "1")
    pskd("decode", rel(tokens), "--vocab", rel(vocab), "-o", rel(OUT / "roundtrip.txt"))
    same = (OUT / "roundtrip.txt").read_bytes() == text.read_bytes()
    print(f"demo: decode(encode(text)) == text: {same}")
    if not same:
        sys.exit("demo: the round trip changed the text")

    sys.path.insert(0, str(ROOT))
    import numpy as np

    import pskd_jax

    with pskd_jax.Reader(windows) as reader:
        order = pskd_jax.shuffle_order(len(reader), seed=0, epoch=1, start=0, stop=4)
        inputs, targets = reader.gather(order)
        vocab_list = json.loads(vocab.read_text(encoding="utf-8"))
        print(f"demo: a shuffled batch of {len(order)} windows {list(map(int, order))}: "
              f"inputs {inputs.shape} {inputs.dtype}")
        shown = "".join(vocab_list[t] for t in inputs[0][:60])
        print(f"demo: window {int(order[0])} reads {shown!r}")
        assert np.array_equal(inputs[:, 1:], targets[:, :-1]), "targets are inputs shifted by one"

    train_and_resume(windows, rel)


def train(pipeline: str, checkpoints: str, steps: int, *extra: str) -> None:
    print(f"$ python -m pskd_jax.apps.train_lm --steps {steps} {' '.join(extra)}", flush=True)
    subprocess.run([sys.executable, "-m", "pskd_jax.apps.train_lm", f"--pipeline={pipeline}", f"--steps={steps}",
                    f"--checkpoint_dir={checkpoints}", "--save_every=75", "--log_every=25", *extra],
                   check=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def train_and_resume(windows: pathlib.Path, rel, *extra: str) -> None:
    """A few hundred jit-compiled steps fed by the loader, checkpointed, stopped and resumed."""
    checkpoints = OUT / "checkpoints"
    pipeline = f'stream "{rel(windows)}" |> shuffle(seed = 1) |> batch(B = 32)'
    train(pipeline, rel(checkpoints), STEPS_FIRST, *extra)
    print("demo: a fresh process picks up the parameters, Adam's state and the loader's position", flush=True)
    train(pipeline, rel(checkpoints), STEPS_TOTAL, "--resume", *extra)
    import json

    index = json.loads((checkpoints / "checkpoints.json").read_text())
    files = [rel(checkpoints / entry["file"]) for entry in index["checkpoints"]]
    pskd("diff", files[0], files[-1])
    pskd("verify", rel(checkpoints))


def corpus_demo(text: pathlib.Path, vocab: pathlib.Path, rel) -> None:
    """``demo.py --corpus``: the same text as JSONL documents in four files → ``pskd corpus build``
    (the character vocabulary, two workers) → ``verify`` → ``info``, then training on windows cut
    on the fly across the shards, stopped and resumed like the file's."""
    import contextlib
    import json

    docs = OUT / "docs"
    docs.mkdir()
    lines = text.read_text(encoding="utf-8").splitlines(keepends=True)
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(docs / f"part-{i}.jsonl", "w", encoding="utf-8")) for i in range(4)]
        for k, start in enumerate(range(0, len(lines), 100)):  # documents of 100 lines
            files[k % 4].write(json.dumps({"text": "".join(lines[start : start + 100])}, ensure_ascii=False) + "\n")
    manifest = OUT / "corpus" / "shards.json"
    pskd("corpus", "build", rel(docs), "--vocab", rel(vocab), "-o", rel(manifest.parent), "--workers", "2")
    pskd("corpus", "verify", rel(manifest))
    pskd("corpus", "info", rel(manifest))
    train_and_resume(manifest, rel, f"--seq={SEQ}")


if __name__ == "__main__":
    main()
