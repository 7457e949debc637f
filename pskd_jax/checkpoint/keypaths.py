"""Key paths (the module lives in :mod:`pskd_jax.format.keypaths`, below the layout file's reader;
re-exported here for the checkpoint code and its callers).
"""

from pskd_jax.format.keypaths import MAX_KEY_DEPTH, check_key_depth, nest, nested_rebuild, path_keys

__all__ = ["MAX_KEY_DEPTH", "check_key_depth", "nest", "nested_rebuild", "path_keys"]
