"""Train a small character-level language model on an ``lm-windows`` file or a sharded corpus.

    python -m pskd_jax.apps.train_lm --pipeline 'stream "out/demo/windows.psk.d" |> shuffle(seed = 1) |> batch(B = 32)' \
        --steps 300 --checkpoint_dir out/demo/ckpt [--resume]
    python -m pskd_jax.apps.train_lm --pipeline 'stream "out/corpus/shards.json" |> shuffle(seed = 1) |> batch(B = 32)' \
        --seq 64 [--stride 64] [--noverify_corpus] [--mask_boundary] --steps 300

A pipeline that streams a corpus manifest trains on windows of ``--seq`` tokens cut on the fly
from the corpus's global token stream (:class:`pskd_jax.corpus.CorpusWindows`). Before training,
every shard is checked against the manifest (sha256, every token below the vocabulary size, its
documents), on one thread per CPU, reading each shard once through the descriptor training then
reads it from: a damaged corpus fails at start, naming the shard (E9017). ``--noverify_corpus``
skips that. ``--mask_boundary`` leaves targets that are the corpus's boundary token out of the
loss (predicting where a document ends is then not learnt).

A ``jit``-compiled step is fed by the loader (batches gathered and ``device_put`` ahead on a
background thread, in pipeline order). With ``--checkpoint_dir`` the parameters, the optimizer
state and the loader's iterator state are saved every ``--save_every`` steps (asynchronously);
``--resume`` continues from the latest complete checkpoint with exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import os
import sys
import time

import tqdm
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("pipeline", None, "The pipeline text, or a file holding it.", required=True)
flags.DEFINE_string("pipeline_root", None, "A --pipeline file may stream files inside this directory "
                    "(default: only inside the pipeline file's own directory).")
flags.DEFINE_integer("steps", 300, "Train until this step (counted across resumptions).")
flags.DEFINE_string("checkpoint_dir", None, "Where to save checkpoints (none if unset).")
flags.DEFINE_integer("save_every", 100, "Save a checkpoint every this many steps.")
flags.DEFINE_integer("keep", 3, "Checkpoints to keep.")
flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --checkpoint_dir.")
flags.DEFINE_integer("log_every", 25, "Print the loss every this many steps.")
flags.DEFINE_integer("width", 64, "Model width.")
flags.DEFINE_integer("layers", 2, "Transformer blocks.")
flags.DEFINE_integer("heads", 4, "Attention heads.")
flags.DEFINE_float("learning_rate", 3e-3, "Adam's learning rate.")
flags.DEFINE_integer("seed", 0, "Seed of the initial parameters.")
flags.DEFINE_integer("seq", None, "Window length when the pipeline streams a corpus (DIR/shards.json).")
flags.DEFINE_integer("stride", None, "Distance between window starts in a corpus (default: --seq).")
flags.DEFINE_bool("verify_corpus", True, "Check every shard of a corpus against its manifest before training "
                  "(sha256, tokens below the vocabulary size, documents), in parallel; --noverify_corpus skips it.")
flags.DEFINE_bool("mask_boundary", False, "Leave targets that are the corpus's boundary token out of the loss "
                  "(a corpus only: its manifest names the boundary).")
flags.DEFINE_string("tokenizer", None, "The tokenizer.json (or VOCAB.json) the model is for: a corpus built with "
                    "another is refused.")
flags.DEFINE_enum("access", "pread", ["pread", "mmap"],
                  "How windows are read (an lm-windows file or a corpus's shards): pread keeps the "
                  "process's resident memory that of the batches in flight whatever the data's size; "
                  "mmap copies from a memory map, faster per window, but the pages it visits "
                  "count in the resident set.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # JAX's backend probing would otherwise log at INFO
    # JAX is imported here, not at the top, so that --help answers without starting it.
    import jax

    from pskd_jax import corpus
    from pskd_jax.checkpoint import CheckpointManager, Retention
    from pskd_jax.errors import PipelineError, PskdError, UsageError
    from pskd_jax.format import Reader
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline import IteratorState, load_pipeline, parse_pipeline

    from . import charlm

    try:
        text = FLAGS.pipeline
        pipeline = load_pipeline(text, root=FLAGS.pipeline_root) if os.path.isfile(text) else parse_pipeline(text, source="--pipeline")
        if corpus.is_manifest(pipeline.path):  # windows cut on the fly from a sharded corpus
            if FLAGS.seq is None:
                raise UsageError(f"{pipeline.path} is a corpus: give the window length with --seq T")
            opened = time.perf_counter()
            reader = corpus.CorpusWindows(pipeline.path, seq=FLAGS.seq, stride=FLAGS.stride,
                                          verify=FLAGS.verify_corpus, access=FLAGS.access, tokenizer=FLAGS.tokenizer)
            if FLAGS.verify_corpus:
                m = reader.manifest
                print(f"train: verified {len(m.shards)} shards, {m.tokens} tokens, in "
                      f"{time.perf_counter() - opened:.2f} s (--noverify_corpus skips this)", flush=True)
            if not reader.complete:
                print(f"train: {pipeline.path} is the manifest of a build in progress or interrupted: "
                      f"{len(reader.manifest.shards)} of {reader.manifest.planned_shards} shards; training on "
                      "those", flush=True)
            vocab, seq, sample_type = reader.vocab_size, reader.seq, reader.type_text
            mask_token = reader.boundary if FLAGS.mask_boundary else None
        else:
            if FLAGS.mask_boundary:
                raise UsageError(f"--mask_boundary needs a corpus (its shards.json names the boundary token); "
                                 f"{pipeline.path} is a .psk.d file")
            if FLAGS.tokenizer is not None:
                raise UsageError(f"--tokenizer checks a corpus's tokenizer; {pipeline.path} is not a corpus manifest")
            mask_token = None
            reader = Reader(pipeline.path, access=FLAGS.access)
            inputs_leaf = reader.placement.layout.leaves[0]
            if inputs_leaf.is_real or len(inputs_leaf.shape) != 1:
                raise PipelineError(
                    f"{reader.path} holds samples of type {reader.header.type_text!r}; the training job reads "
                    "lm-windows files, of type (idx[V][seq: T], idx[V][seq: T]), or a corpus's shards.json")
            vocab, seq, sample_type = inputs_leaf.bound, inputs_leaf.shape[0], reader.header.type_text
        pipeline.check_batch_type(sample_type, f"(idx[{vocab}][B, seq: {seq}], idx[{vocab}][B, seq: {seq}])")
        config = charlm.ModelConfig(vocab=vocab, seq=seq, width=FLAGS.width, layers=FLAGS.layers,
                                    heads=FLAGS.heads)
        params = charlm.init_params(config, FLAGS.seed)
        opt = charlm.init_adam(params)
        step, state = 0, IteratorState()
        manager = (CheckpointManager(FLAGS.checkpoint_dir, retention=Retention(keep=FLAGS.keep))
                   if FLAGS.checkpoint_dir else None)
        if FLAGS.resume and manager is not None and manager.latest_step() is not None:
            restored = manager.restore(target={"params": params, "opt": opt})
            params, opt = restored["params"], restored["opt"]
            extra = manager.extra()
            step, state = extra["step"], IteratorState.from_json(extra["loader"])
            print(f"train: resumed at step {step} from {manager.path()} (next batch: epoch {state.epoch}, "
                  f"batch {state.batch})", flush=True)
    except PskdError as e:
        print(f"train: {e}", file=sys.stderr)
        sys.exit(1)

    masked = f" (targets {mask_token}, the boundary, left out of the loss)" if mask_token is not None else ""
    print(f"train: {len(reader)} windows of {seq} tokens over a vocabulary of {vocab}{masked}; {pipeline}; "
          f"model width {config.width}, {config.layers} blocks, {config.heads} heads; "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s)", flush=True)
    train_step = charlm.make_train_step(config, FLAGS.learning_rate, mask_token)
    started, first_step = time.perf_counter(), step
    loader = Loader(reader, pipeline, state=state)
    bar = tqdm.tqdm(total=FLAGS.steps, initial=step, unit="step", disable=not sys.stdout.isatty(), file=sys.stdout,
                    dynamic_ncols=True, leave=False)
    for inputs, targets in loader:
        if step >= FLAGS.steps:
            break
        params, opt, loss_value = train_step(params, opt, inputs, targets)
        step += 1
        rate = (step - first_step) / (time.perf_counter() - started)
        if step % FLAGS.log_every == 0 or step == FLAGS.steps or step == first_step + 1:
            loss = float(loss_value)
            bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
            tqdm.tqdm.write(f"step {step:5d}  loss {loss:.4f}  ({rate:.1f} steps/s)", file=sys.stdout)
            sys.stdout.flush()
        bar.update(1)
        if manager is not None and (step % FLAGS.save_every == 0 or step == FLAGS.steps):
            manager.save_async(step, {"params": params, "opt": opt},
                               extra={"step": step, "loader": loader.state.to_json()})
    loader.close()
    bar.close()
    if manager is not None:
        manager.wait()
        print(f"train: checkpoints at steps {manager.all_steps()} in {FLAGS.checkpoint_dir}", flush=True)
    waited = loader.waited_seconds / max(time.perf_counter() - started, 1e-9)
    print(f"train: {step - first_step} steps in {time.perf_counter() - started:.1f} s, "
          f"{100 * waited:.1f}% of it waiting for data", flush=True)


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()


__all__ = ["FLAGS", "main", "run"]
