"""The demo: a real text through the data commands, run as a user runs them.

The text is the Python standard library's own ``.py`` sources, which every machine with Python
has: they go through ``pskd chars`` → ``pskd encode`` → ``pskd lm-windows`` → ``pskd info``, and the
windows are read back with the library to show a batch. ``demo.py --corpus`` takes the corpus
path instead: the text as JSONL documents → ``pskd corpus build`` → ``verify`` → ``info``, and
training on windows cut across the shards.

Training runs twice: stopped halfway and resumed in a fresh process, and uninterrupted, in a
directory of its own; the demo then shows that both end with the same checkpoint, bit for bit.
Every command is echoed as it is run (the same argument list, quoted for a shell).

``make demo`` writes under ``out/demo/``, ``make demo-corpus`` under ``out/demo-corpus/``: each
starts by removing its own directory, and only when the demo made it (it holds the demo's marker
file); neither touches the other's.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = "--corpus" in sys.argv[1:]
OUT = ROOT / "out" / ("demo-corpus" if CORPUS else "demo")  # one directory per demo: neither removes the other's
MARKER = ".pskd-demo"  # in OUT: the demo made it, and may remove it when it starts again
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
    print("$ " + shlex.join(["pskd", *args]), flush=True)  # (python -m pskd_jax.apps.pskd is the pskd command)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *args], check=True, cwd=ROOT)
    print(f"  ({time.perf_counter() - started:.2f} s)", flush=True)


def fresh_output() -> None:
    """An empty OUT: the demo's own earlier output removed; anything else standing there refused."""
    if OUT.exists() or OUT.is_symlink():
        if OUT.is_symlink() or not (OUT / MARKER).is_file():
            sys.exit(f"demo: {OUT} exists and was not made by the demo (no {MARKER} in it): move it away, "
                     "the demo removes only its own output")
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / MARKER).write_text("made by demo/demo.py, which removes this directory when it runs again\n")


def main() -> None:
    sys.path.insert(0, str(ROOT))  # this checkout's pskd_jax, for the reads the demo does itself
    fresh_output()
    text = OUT / "stdlib.txt"
    size = gather_stdlib_text(text, TEXT_BYTES)
    print(f"demo: {size / 1e6:.1f} MB of the standard library's Python sources in {text.relative_to(ROOT)}")
    rel = lambda p: str(p.relative_to(ROOT))  # noqa: E731 - paths as a user would type them
    vocab, tokens, windows = OUT / "vocab.json", OUT / "tokens.txt", OUT / "windows.psk.d"
    pskd("chars", rel(text), "-o", rel(vocab))
    if CORPUS:
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
    """Runs the training app, echoing the very command line it runs."""
    args = ["-m", "pskd_jax.apps.train_lm", f"--pipeline={pipeline}", f"--steps={steps}",
            f"--checkpoint_dir={checkpoints}", "--save_every=75", "--log_every=25", *extra]
    env = {"JAX_PLATFORMS": "cpu"}
    print("$ " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(["python", *args]),
          flush=True)
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT, env=dict(os.environ, **env))


def train_and_resume(windows: pathlib.Path, rel, *extra: str) -> None:
    """A few hundred jit-compiled steps fed by the loader, checkpointed, stopped and resumed; then
    the same steps uninterrupted, and the two runs' last checkpoints compared."""
    import json

    import numpy as np

    import pskd_jax

    checkpoints, whole = OUT / "checkpoints", OUT / "checkpoints-uninterrupted"
    pipeline = f'stream "{rel(windows)}" |> shuffle(seed = 1) |> batch(B = 32)'
    train(pipeline, rel(checkpoints), STEPS_FIRST, *extra)
    print("demo: a fresh process picks up the parameters, Adam's state and the loader's position", flush=True)
    train(pipeline, rel(checkpoints), STEPS_TOTAL, "--resume", *extra)
    index = json.loads((checkpoints / "checkpoints.json").read_text())
    files = [rel(checkpoints / entry["file"]) for entry in index["checkpoints"]]
    pskd("diff", files[0], files[-1])
    pskd("verify", rel(checkpoints))

    print(f"demo: the same {STEPS_TOTAL} steps again in one process, without stopping, for comparison", flush=True)
    train(pipeline, rel(whole), STEPS_TOTAL, *extra)
    ends = [pskd_jax.CheckpointManager(d, read_only=True) for d in (checkpoints, whole)]
    resumed, uninterrupted = (m.restore(as_numpy=True) for m in ends)
    paths = [m.path() for m in ends]
    pskd("diff", rel(pathlib.Path(paths[0])), rel(pathlib.Path(paths[1])))
    leaves = [np.asarray(leaf) for leaf in _leaves(resumed)], [np.asarray(leaf) for leaf in _leaves(uninterrupted)]
    same_leaves = len(leaves[0]) == len(leaves[1]) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(*leaves))
    same_file = pathlib.Path(paths[0]).read_bytes() == pathlib.Path(paths[1]).read_bytes()
    same_extra = ends[0].extra() == ends[1].extra()
    print(f"demo: resumed run ({STEPS_FIRST} + {STEPS_TOTAL - STEPS_FIRST} steps) vs uninterrupted run "
          f"({STEPS_TOTAL} steps) at step {ends[0].latest_step()}: {len(leaves[0])} parameter and optimizer "
          f"arrays equal bit for bit: {same_leaves}; checkpoint files identical: {same_file}; loader states "
          f"equal: {same_extra}", flush=True)
    if not (same_leaves and same_file and same_extra):
        sys.exit("demo: the resumed run differs from the uninterrupted one")


def _leaves(tree) -> list:
    """The leaves of a restored tree (dicts and lists), in key order."""
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree, key=str) for leaf in _leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


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
