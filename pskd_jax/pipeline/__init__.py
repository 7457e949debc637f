"""Pipelines over sample indices: the pipeline text, epochs and batches, and the epoch shuffle.

Never imports JAX: a pipeline yields sample indices, and :mod:`pskd_jax.loader` turns them into
device batches. The text, its evaluation and the shuffle's definition: ``docs/pipeline.md``.
"""

from pskd_jax.pipeline.batches import IteratorState, Pipeline
from pskd_jax.pipeline.mixture import MixSource, Mixture
from pskd_jax.pipeline.parse import load_pipeline, parse_pipeline
from pskd_jax.pipeline.shuffle import shuffle_order
from pskd_jax.pipeline.streams import StreamFacts, stream_facts

__all__ = ["IteratorState", "MixSource", "Mixture", "Pipeline", "StreamFacts", "load_pipeline", "parse_pipeline",
           "shuffle_order", "stream_facts"]
