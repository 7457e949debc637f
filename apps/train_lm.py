"""Train a small character-level language model on an ``lm-windows`` file or a sharded corpus.

    python -m pskd_jax.apps.train_lm \
        --pipeline 'stream "out/demo/windows.psk.d" |> shuffle(seed = 1) |> batch(B = 32)' \
        --steps 300 --checkpoint_dir out/demo/ckpt [--resume]
    python -m pskd_jax.apps.train_lm \
        --pipeline 'stream "out/corpus/shards.json" |> shuffle(seed = 1) |> batch(B = 32)' \
        --seq 64 [--stride 64] [--noverify_corpus] [--mask_boundary] [--segments] --steps 300
    python -m pskd_jax.apps.train_lm --seq 64 --segments --steps 300 \
        --pipeline 'mix(stream "web/shards.json" |> shuffle(seed = 1) : 3,
                        stream "code/shards.json" |> shuffle(seed = 2) : 1) |> batch(B = 32)'

A pipeline that streams a corpus manifest trains on windows of ``--seq`` tokens cut on the fly
from the corpus's global token stream (:class:`pskd_jax.corpus.CorpusWindows`). Before training,
every shard is checked against the manifest (sha256, every token below the vocabulary size, its
documents), on one thread per CPU, reading each shard once, the very file training then reads
from: a damaged corpus fails at start, naming the shard (E9017). ``--noverify_corpus``
skips that. ``--mask_boundary`` leaves targets that are the corpus's boundary token out of the
loss (predicting where a document ends is then not learnt). ``--segments`` packs documents: a token
attends only to its own document's earlier tokens and its position counts from its document's
start (the windows' segment ids and positions, ``CorpusWindows(…, segments=True)``). A ``mix(…)`` of
corpora (or of lm-windows files) of one sample type trains on the mixture, each source in its own
order; its resume is as exact as a single stream's.

A ``jit``-compiled step is fed by the loader (batches gathered and ``device_put`` ahead on a
background thread, in pipeline order). With ``--checkpoint_dir`` the parameters, the optimizer
state and the loader's iterator state are saved every ``--save_every`` steps (asynchronously);
``--resume`` continues from the latest complete checkpoint with exactly the batches an
uninterrupted run would have seen; a checkpoint that does not keep that state (its step and the
loader's, train_lm's extra JSON) is refused, E9014 naming it. Without ``--resume``, a
``--checkpoint_dir`` that already holds checkpoints is refused (E9012): a new run saved among
another's would mix the two.
Flags no run can use (a count below 1, a period of 0 steps, ``--heads`` not dividing ``--width``,
a learning rate that is not a finite number above 0) are refused before anything is opened (E9012
naming the flag and its value). What else costs little to refuse (a stream that is not there, a flag
its kind of stream cannot take, a ``--checkpoint_dir`` in a bucket that is not there or holding
another run's checkpoints) is refused before any corpus is verified. An error of the toolkit, at
set-up or mid-run, prints one line ``pskd: E9xxx: …`` on stderr, no traceback, and exits 1.
``--help`` (and ``--helpfull``) print the usage and exit 0.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Any

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
flags.DEFINE_integer("heads", 4, "Attention heads (a divisor of --width).")
flags.DEFINE_float("learning_rate", 3e-3, "Adam's learning rate (a finite number > 0).")
flags.DEFINE_integer("seed", 0, "Seed of the initial parameters.")
flags.DEFINE_integer("seq", None, "Window length when the pipeline streams a corpus (DIR/shards.json).")
flags.DEFINE_integer("stride", None, "Distance between window starts in a corpus (default: --seq).")
flags.DEFINE_bool("verify_corpus", True, "Check every shard of a corpus against its manifest before training "
                  "(sha256, tokens below the vocabulary size, documents), in parallel; --noverify_corpus skips it.")
flags.DEFINE_bool("mask_boundary", False, "Leave targets that are the corpus's boundary token out of the loss "
                  "(a corpus only: its manifest names the boundary).")
flags.DEFINE_bool("segments", False, "Attention inside each document and positions from each document's start "
                  "(the windows' segment ids and positions; corpora only).")
flags.DEFINE_string("tokenizer", None, "The tokenizer.json (or VOCAB.json) the model is for: a corpus built with "
                    "another is refused.")
flags.DEFINE_enum("access", "pread", ["pread", "mmap"],
                  "How windows are read (an lm-windows file or a corpus's shards): pread keeps the "
                  "process's resident memory that of the batches in flight whatever the data's size; "
                  "mmap copies from a memory map, faster per window, but the pages it visits "
                  "count in the resident set.")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run the flags ask for (see their help)."""

    pipeline: str
    pipeline_root: str | None
    steps: int
    checkpoint_dir: str | None
    save_every: int
    keep: int
    resume: bool
    log_every: int
    width: int
    layers: int
    heads: int
    learning_rate: float
    seed: int
    seq: int | None
    stride: int | None
    verify_corpus: bool
    mask_boundary: bool
    segments: bool
    tokenizer: str | None
    access: str

    @classmethod
    def from_flags(cls, values: Any) -> RunConfig:
        return cls(**{field.name: getattr(values, field.name) for field in dataclasses.fields(cls)})


# The integer flags and the least value each takes: a count of nothing (steps, blocks, heads, features,
# checkpoints kept, tokens a window) trains no model, a period of 0 steps divides by zero, and a seed
# is a non-negative integer (numpy's). --seq and --stride may be unset.
INTEGER_FLAG_LEAST = {"steps": 1, "save_every": 1, "keep": 1, "log_every": 1, "width": 1, "layers": 1, "heads": 1,
                      "seed": 0, "seq": 1, "stride": 1}


def check_flags(config: RunConfig) -> None:
    """Refuses (E9012, naming the flag and its value) a flag no run can use, before anything is opened
    or started: an integer below its least value, ``--heads`` that does not divide ``--width`` (each
    head takes width/heads of the features), a learning rate that is not a finite number above 0."""
    from pskd_jax._os.checks import checked_integer
    from pskd_jax.errors import UsageError

    for name, least in INTEGER_FLAG_LEAST.items():
        value = getattr(config, name)
        if value is not None:
            checked_integer(value, f"--{name}", low=least)
    if config.width % config.heads:
        raise UsageError(f"--heads={config.heads}: does not divide --width={config.width} (each head takes "
                         "width/heads of the features)")
    if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
        raise UsageError(f"--learning_rate={config.learning_rate!r}: expected a finite number > 0")


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """What the model trains on: the source of windows, the pipeline over it, and what the model
    needs to know of it; ``notes`` are the lines to print about it."""

    source: Any  # a CorpusWindows or a Reader of an lm-windows file; a list of them for a mix(…)
    pipeline: Any
    sample_type: str
    vocab: int
    seq: int
    mask_token: int | None
    notes: tuple[str, ...] = ()
    segments: bool = False

    @property
    def windows(self) -> int:
        """How many windows the sources hold (a mixture's: every source's)."""
        return sum(map(len, self.source)) if isinstance(self.source, list) else len(self.source)


@dataclasses.dataclass(frozen=True)
class Streams:
    """What ``--pipeline`` names, read before anything is opened: the pipeline, and each of its
    streams' paths with whether it is a corpus manifest (else an lm-windows file)."""

    pipeline: Any
    paths: tuple[str, ...]
    corpora: tuple[bool, ...]


def read_streams(config: RunConfig) -> Streams:
    """The pipeline named by ``--pipeline`` and what each of its streams is, with every refusal that
    needs no more than that, before anything is opened or verified: a stream that is not there
    (E9010 at its place, the Loader's own check) and a flag its kind of stream cannot take (E9012)."""
    from pskd_jax.pipeline import load_pipeline, parse_pipeline
    from pskd_jax.pipeline.streams import check_streams, is_corpus_manifest, stream_places

    text = config.pipeline
    pipeline = (load_pipeline(text, root=config.pipeline_root) if os.path.isfile(text)
                else parse_pipeline(text, source="--pipeline"))
    check_streams(pipeline)
    paths = tuple(path for path, _ in stream_places(pipeline))
    streams = Streams(pipeline, paths, tuple(is_corpus_manifest(path) for path in paths))  # (the Loader's decision)
    check_cut_flags(streams, config)
    for path, is_corpus in zip(streams.paths, streams.corpora):
        check_stream_flags(path, is_corpus, config)
    return streams


def check_cut_flags(streams: Streams, config: RunConfig) -> None:
    """E9012 for ``--seq`` or ``--stride`` when no stream is a corpus: an lm-windows file's windows
    are cut already, and the flag would go unheeded."""
    from pskd_jax.errors import UsageError
    from pskd_jax.format import Reader

    if any(streams.corpora):
        return
    for name in ("seq", "stride"):
        if getattr(config, name) is not None:
            for path in streams.paths:  # (a file that is no .psk.d file either is the Loader's E9002, not "one")
                Reader(path).close()
            raise UsageError(f"--{name} cuts a corpus's windows; {streams.paths[0]} is a .psk.d file of windows cut "
                             "already")


def check_stream_flags(path: str, is_corpus: bool, config: RunConfig) -> None:
    """E9012 for a corpus without ``--seq`` (its windows' length), and for a flag that needs a
    corpus (``--mask_boundary``, ``--segments``, ``--tokenizer``) given with an lm-windows file."""
    from pskd_jax.errors import UsageError

    if is_corpus:
        if config.seq is None:
            raise UsageError(f"{path} is a corpus: give the window length with --seq T")
        return
    if config.mask_boundary:
        raise UsageError(f"--mask_boundary needs a corpus (its shards.json names the boundary token); "
                         f"{path} is a .psk.d file")
    if config.segments:
        raise UsageError(f"--segments needs a corpus (its shards.json names the boundary token); {path} is a "
                         ".psk.d file")
    if config.tokenizer is not None:
        raise UsageError(f"--tokenizer checks a corpus's tokenizer; {path} is not a corpus manifest")


def open_data(streams: Streams, config: RunConfig) -> TrainingData:
    """The sources the pipeline streams (each corpus verified unless ``--noverify_corpus``):
    windows cut from a corpus (its manifest), or an lm-windows file; each source of a ``mix(…)``.
    A mix's sources are checked against each other (sample types, boundaries) before any corpus
    is verified, which reads every shard."""
    from pskd_jax.pipeline import Mixture

    pipeline = streams.pipeline
    if not isinstance(pipeline, Mixture):
        return _verified(_stream_data(streams.paths[0], streams.corpora[0], pipeline, config), config)
    parts: list[TrainingData] = []
    try:
        for path, is_corpus in zip(streams.paths, streams.corpora):
            parts.append(_stream_data(path, is_corpus, pipeline, config))
        check_mix(pipeline, parts)
        parts = [_verified(part, config) for part in parts]
    except BaseException:
        for part in parts:
            part.source.close()
        raise
    first = parts[0]
    notes = tuple(note for part in parts for note in part.notes)
    return TrainingData([part.source for part in parts], pipeline, first.sample_type, first.vocab, first.seq,
                        first.mask_token, notes, first.segments)


def check_mix(pipeline: Any, parts: list[TrainingData]) -> None:
    """Refuses a mix whose sources do not go together: sample types that differ (E9010), or
    documents ended by different tokens under ``--mask_boundary`` or ``--segments`` (E9012)."""
    from pskd_jax.errors import UsageError

    pipeline.check_sample_types([part.sample_type for part in parts])
    masks = {part.mask_token for part in parts}
    if len(masks) > 1:
        raise UsageError(f"--mask_boundary: the corpora of the mix end their documents with different tokens "
                         f"{sorted(m for m in masks if m is not None)}")
    for part in parts:
        if part.segments and part.source.boundary != parts[0].source.boundary:
            raise UsageError(f"--segments: the corpora of the mix end their documents with different tokens "
                             f"({part.source.boundary} in {part.source.path}, {parts[0].source.boundary} in "
                             f"{parts[0].source.path})")


def _verified(data: TrainingData, config: RunConfig) -> TrainingData:
    """``data`` with its corpus verified (every shard read against its manifest) unless
    ``--noverify_corpus``, and a note of how long that took; an lm-windows file as it is."""
    from pskd_jax import corpus
    from pskd_jax._os.checks import counted

    windows = data.source
    if not config.verify_corpus or not isinstance(windows, corpus.CorpusWindows):
        return data
    started = time.perf_counter()
    windows.verify_shards()
    m = windows.manifest
    note = (f"train: verified {counted(len(m.shards), 'shard')}, {counted(m.tokens, 'token')}, in "
            f"{time.perf_counter() - started:.2f} s (--noverify_corpus skips this)")
    return dataclasses.replace(data, notes=(note, *data.notes))


def _stream_data(path: str, is_corpus: bool, pipeline: Any, config: RunConfig) -> TrainingData:
    return _corpus_data(path, pipeline, config) if is_corpus else _windows_file_data(path, pipeline, config)


def check_batches(data: TrainingData) -> None:
    """Refuses a pipeline whose batches are not the model's ``(inputs, targets)`` windows."""
    batch = f"idx[{data.vocab}][B, seq: {data.seq}]"
    data.pipeline.check_batch_type(data.sample_type, f"({batch}, {batch})")


def _corpus_data(path: str, pipeline: Any, config: RunConfig) -> TrainingData:
    """Windows of ``--seq`` tokens cut on the fly from a corpus, not yet verified (:func:`_verified`;
    its flags checked already: :func:`check_stream_flags`)."""
    from pskd_jax import corpus

    assert config.seq is not None  # (check_stream_flags refused a corpus without it)
    windows = corpus.CorpusWindows(path, seq=config.seq, stride=config.stride, access=config.access,
                                   tokenizer=config.tokenizer, segments=config.segments)
    notes = []
    m = windows.manifest
    if not windows.complete:
        notes.append(f"train: {path} is the manifest of a build in progress or interrupted: "
                     f"{len(m.shards)} of {m.planned_shards} shards; training on those")
    mask_token = windows.boundary if config.mask_boundary else None
    return TrainingData(windows, pipeline, windows.type_text, windows.vocab_size, windows.seq, mask_token, tuple(notes),
                        config.segments)


def _windows_file_data(path: str, pipeline: Any, config: RunConfig) -> TrainingData:
    """The windows of an lm-windows file, of type ``(idx[V][seq: T], idx[V][seq: T])`` (its flags
    checked already: :func:`check_stream_flags`)."""
    from pskd_jax.errors import PipelineError
    from pskd_jax.format import Reader

    reader = Reader(path, access=config.access)
    inputs_leaf = reader.placement.layout.leaves[0] if reader.placement is not None else None  # (None: params)
    if inputs_leaf is None or inputs_leaf.is_real or inputs_leaf.bound is None or len(inputs_leaf.shape) != 1:
        raise PipelineError(
            f"{reader.path} holds samples of type {reader.header.type_text!r}; the training job reads "
            "lm-windows files, of type (idx[V][seq: T], idx[V][seq: T]), or a corpus's shards.json")
    return TrainingData(reader, pipeline, reader.header.type_text, inputs_leaf.bound, inputs_leaf.shape[0], None)


def checkpoint_manager(config: RunConfig) -> Any:
    """The run's checkpoint manager, None without ``--checkpoint_dir``. Without ``--resume``, a
    directory that already holds checkpoints is refused (E9012): a new run saved among them would
    mix two runs' steps, and a later ``--resume`` would pick up whichever is latest."""
    from pskd_jax.checkpoint import CheckpointManager, Retention
    from pskd_jax.errors import UsageError

    if not config.checkpoint_dir:
        return None
    manager = CheckpointManager(config.checkpoint_dir, retention=Retention(keep=config.keep))
    steps = manager.all_steps()
    if steps and not config.resume:
        manager.close()
        raise UsageError(f"--checkpoint_dir {config.checkpoint_dir}: holds the checkpoints of an earlier run (steps "
                         f"{', '.join(map(str, steps))}); a new run saved there would mix the two: give --resume to "
                         "continue that run, or another --checkpoint_dir for a new one")
    return manager


def missing_directories(checkpoint_dir: str | None) -> list[str]:
    """The directories a manager of the local ``checkpoint_dir`` would make (those not there yet,
    outermost first); none for a bucket, which a manager makes nothing in until it saves."""
    from pskd_jax.storage import locate

    where = locate(checkpoint_dir) if checkpoint_dir else None
    if where is None or not where.is_local:
        return []
    missing, here = [], os.path.abspath(where.path)
    while not os.path.lexists(here):
        missing.append(here)
        here = os.path.dirname(here)
    return missing[::-1]


def remove_unused(made: list[str]) -> None:
    """Removes the directories this run made (``made``, outermost first) while they hold nothing
    but what the manager itself put there (its lock file): a refused run leaves no output."""
    from pskd_jax._os.names import CHECKPOINT_LOCK

    for directory in reversed(made):
        try:
            names = os.listdir(directory)
            if set(names) - {CHECKPOINT_LOCK}:
                return  # (something else is there now: it stays, and so do the directories above it)
            if names:
                os.unlink(os.path.join(directory, CHECKPOINT_LOCK))
            os.rmdir(directory)
        except OSError:
            return


@dataclasses.dataclass(frozen=True)
class Start:
    """Where training starts: the parameters, the optimizer state, the step and the loader's state."""

    params: Any
    opt: Any
    step: int
    loader_state: Any
    resumed_from: str | None = None  # the checkpoint resumed from, if any


def fresh_start(config: RunConfig, model: Any) -> Start:
    """Step 0: initial parameters (from ``--seed``), a zero optimizer state, the loader at its start."""
    from pskd_jax.pipeline import IteratorState

    from . import charlm

    params = charlm.init_params(model, config.seed)
    return Start(params, charlm.init_adam(params), 0, IteratorState())


def resume(fresh: Start, manager: Any) -> Start:
    """The latest checkpoint's parameters and optimizer state, restored into ``fresh``'s structure,
    with the step and the loader's state saved beside them; ``fresh`` itself when there is none."""
    if manager is None or manager.latest_step() is None:
        return fresh
    step = manager.latest_step()
    loader_state = saved_loader_state(manager, step)  # (checked before the whole file is read)
    restored = manager.restore(step, target={"params": fresh.params, "opt": fresh.opt})
    return Start(restored["params"], restored["opt"], step, loader_state, manager.path(step))


RESUME_EXTRA_KEYS = ("step", "loader")  # the extra JSON train() saves with each checkpoint


def saved_loader_state(manager: Any, step: int) -> Any:
    """The loader's state that ``step``'s checkpoint keeps in its extra JSON, beside the step itself,
    as train() saves them. E9014 naming the checkpoint and what is missing or wrong when the extra is
    not train_lm's: an index rebuilt after checkpoints.json was lost keeps none, and a checkpoint
    another program saved keeps its own (resuming from it would start the loader at a guess)."""
    from pskd_jax._os.checks import abridged, is_integer
    from pskd_jax.errors import CheckpointDirectoryError, PskdError
    from pskd_jax.pipeline import IteratorState

    path, extra = manager.path(step), manager.extra(step)

    def refused(what: str) -> CheckpointDirectoryError:
        return CheckpointDirectoryError(f"{path}: cannot resume from it: {what} (train_lm saves the step and the "
                                        'loader\'s state with each checkpoint: {"step": N, "loader": {"epoch": E, '
                                        '"batch": B}})')

    if extra is None:
        raise refused("it keeps no extra JSON; the directory's checkpoints.json keeps it, and one rebuilt after "
                      "it was lost has none")
    if not isinstance(extra, dict):
        raise refused(f"its extra JSON is {abridged(extra, 80)}, not an object")
    missing = [key for key in RESUME_EXTRA_KEYS if key not in extra]
    if missing:
        raise refused(f"its extra JSON {abridged(extra, 80)} has no {' and no '.join(map(repr, missing))}")
    unknown = sorted(set(extra) - set(RESUME_EXTRA_KEYS))
    if unknown:
        raise refused(f"its extra JSON holds {', '.join(map(repr, unknown))}, which train_lm does not save")
    if not is_integer(extra["step"]) or extra["step"] != step:
        raise refused(f"its extra JSON's step {abridged(extra['step'], 80)} is not the checkpoint's step {step}")
    try:
        return IteratorState.from_json(extra["loader"])
    except PskdError as e:
        raise refused(f"its extra JSON's loader: {e.message}") from e


def train(config: RunConfig, data: TrainingData, model: Any, begin: Start, manager: Any) -> tuple[int, float, float]:
    """The loop: a jit-compiled step over the loader's batches until ``--steps``, the loss printed every
    ``--log_every`` steps, a checkpoint saved asynchronously every ``--save_every`` (and at the end).
    Returns the last step, the seconds it ran and the share of them spent waiting for data."""
    from pskd_jax.loader import Loader

    from . import charlm

    train_step = charlm.make_train_step(model, config.learning_rate, data.mask_token)
    params, opt, step = begin.params, begin.opt, begin.step
    started = time.perf_counter()
    loader = Loader(data.source, data.pipeline, state=begin.loader_state)
    bar = tqdm.tqdm(total=config.steps, initial=step, unit="step", disable=not sys.stdout.isatty(), file=sys.stdout,
                    dynamic_ncols=True, leave=False)
    try:  # (an error mid-run stops the loader's thread and the bar before it is reported)
        for batch in loader:  # (inputs, targets), and with --segments (…, segment_ids, positions)
            if step >= config.steps:
                break
            params, opt, loss_value = train_step(params, opt, *batch)
            step += 1
            rate = (step - begin.step) / (time.perf_counter() - started)
            if step % config.log_every == 0 or step == config.steps or step == begin.step + 1:
                loss = float(loss_value)
                bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
                tqdm.tqdm.write(f"step {step:5d}  loss {loss:.4f}  ({rate:.1f} steps/s)", file=sys.stdout)
                sys.stdout.flush()
            bar.update(1)
            if manager is not None and (step % config.save_every == 0 or step == config.steps):
                manager.save_async(step, {"params": params, "opt": opt},
                                   extra={"step": step, "loader": loader.state.to_json()})
    finally:
        loader.close()
        bar.close()
    if manager is not None:
        manager.wait()
    seconds = time.perf_counter() - started
    return step, seconds, loader.waited_seconds / max(seconds, 1e-9)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # JAX's backend probing would otherwise log at INFO
    from pskd_jax._os import interrupts
    from pskd_jax.errors import PskdError

    # The whole run, training included: a shard or file that fails mid-run (a value out of its
    # bound, a save that cannot be written) is the toolkit's one line, as every pskd command prints it.
    interrupts.install()
    try:
        config = RunConfig.from_flags(FLAGS)
        check_flags(config)  # (before anything is opened, JAX imported or a checkpoint directory made)
        run_training(config)
    except (Exception, KeyboardInterrupt) as e:
        # Ctrl-C: the checkpoints saved so far stand, a save cut off is not listed. What a library
        # raised while the KeyboardInterrupt unwound through it (tqdm's lock: "cannot release
        # un-acquired lock") is the interrupt's doing too.
        if isinstance(e, KeyboardInterrupt) or interrupts.noted():
            print("pskd: interrupted", file=sys.stderr)
            sys.exit(130)
        if isinstance(e, PskdError):
            print(f"pskd: {e}", file=sys.stderr)
            sys.exit(1)
        raise


def run_training(config: RunConfig) -> None:
    """Opens the data, the model and the checkpoints the flags name, trains, and prints what it did."""
    # JAX is imported here, not at the top, so that --help answers without starting it.
    import jax

    from . import charlm

    # Every refusal that costs little comes before a corpus is verified (which reads every shard):
    # the streams and the flags they take, then the checkpoint directory (a bucket that is not
    # there, another run's checkpoints without --resume).
    streams = read_streams(config)
    made = missing_directories(config.checkpoint_dir)
    manager = checkpoint_manager(config)
    try:
        data = open_data(streams, config)
        for note in data.notes:
            print(note, flush=True)
        check_batches(data)
        model = charlm.ModelConfig(vocab=data.vocab, seq=data.seq, width=config.width, layers=config.layers,
                                   heads=config.heads)
        begin = fresh_start(config, model)
        if config.resume:
            begin = resume(begin, manager)
    except BaseException:  # (refused before the first step: no directory of this run's left behind)
        if manager is not None:
            manager.close()
            remove_unused(made)
        raise
    if begin.resumed_from is not None:
        print(f"train: resumed at step {begin.step} from {begin.resumed_from} (next batch: epoch "
              f"{begin.loader_state.epoch}, batch {begin.loader_state.batch})", flush=True)

    masked = f" (targets {data.mask_token}, the boundary, left out of the loss)" if data.mask_token is not None else ""
    packed = " (packed segments: attention inside each document)" if data.segments else ""
    print(f"train: {data.windows} windows of {data.seq} tokens over a vocabulary of {data.vocab} tokens"
          f"{masked}{packed}; "
          f"{data.pipeline}; model width {model.width}, {model.layers} blocks, {model.heads} heads; "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s)", flush=True)
    step, seconds, waited = train(config, data, model, begin, manager)
    if manager is not None:
        print(f"train: checkpoints at steps {manager.all_steps()} in {config.checkpoint_dir}", flush=True)
    print(f"train: {step - begin.step} steps in {seconds:.1f} s, {100 * waited:.1f}% of it waiting for data",
          flush=True)


# absl's help flags print the usage and then exit with status 1; asking for help is no error.
HELP_FLAGS = frozenset(f"{dash}{name}" for dash in ("-", "--")
                       for name in ("help", "helpshort", "helpfull", "helpxml", "?"))


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parse (usage errors: one line, status 1), except that ``--help`` and its kin exit 0
    once they have printed the usage."""
    try:
        return app.parse_flags_with_usage(argv)
    except SystemExit as e:
        asked = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
        if e.code == 1 and any(arg.removesuffix("=true") in HELP_FLAGS for arg in asked):
            sys.exit(0)
        raise


def run() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()


__all__ = ["FLAGS", "HELP_FLAGS", "INTEGER_FLAG_LEAST", "RESUME_EXTRA_KEYS", "RunConfig", "Start", "Streams",
           "TrainingData", "check_batches", "check_cut_flags", "check_flags", "check_stream_flags",
           "checkpoint_manager", "fresh_start", "main", "missing_directories", "open_data", "parse_flags",
           "read_streams", "remove_unused", "resume", "run", "run_training", "saved_loader_state", "train"]
