"""Where JAX enters for data: batches gathered from a source and ``device_put`` ahead of a step."""

from pskd_jax.loader.loader import Loader, Source, local_rows

__all__ = ["Loader", "Source", "local_rows"]
