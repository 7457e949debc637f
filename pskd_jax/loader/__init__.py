"""Where JAX enters for data: batches gathered from a source and ``device_put`` ahead of a step.

:class:`Source`, what a loader reads from, is defined on the data side
(:mod:`pskd_jax.format.source`) and named here too.
"""

from pskd_jax.format.source import Source
from pskd_jax.loader.loader import Loader, local_rows

__all__ = ["Loader", "Source", "local_rows"]
