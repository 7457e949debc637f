"""Checkpoints: any pytree saved as one ``.psk.d`` sample and restored exactly, a directory of
them by step, and conversion to and from safetensors.

Every dtype a train state holds is kept bit for bit (floats with their NaN payloads, signed and
narrow integers, float8, complex, typed PRNG keys, Python scalars); restore matches a target by
key path through the layout file, which proves it belongs to its data file. What comes back, with
and without a target: :mod:`pskd_jax.checkpoint.restoring`; the table of stored forms:
:mod:`pskd_jax.format.stored_dtypes`.

JAX is imported only when a restore makes device arrays.
"""

from pskd_jax._os.digests import DIGESTS, file_digest, file_sha256
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.integrity import CHECKPOINT_DIGEST, verify_file
from pskd_jax.checkpoint.manager import CheckpointManager, entry_digests, read_index, recorded_digests, verify_directory
from pskd_jax.checkpoint.planning import SavePlan, SaveResult, plan
from pskd_jax.checkpoint.restoring import restore
from pskd_jax.checkpoint.safetensors import convert, pskd_to_safetensors, safetensors_to_pskd
from pskd_jax.checkpoint.saving import save
from pskd_jax.format.keypaths import nest, path_keys
from pskd_jax.format.layout_file import (
    LayoutFile,
    check_belongs,
    find_layout,
    find_layout_file,
    read_layout,
    read_layout_file,
)

__all__ = [
    "CHECKPOINT_DIGEST",
    "DIGESTS",
    "CheckpointManager",
    "LayoutFile",
    "SavePlan",
    "SaveResult",
    "convert",
    "entry_digests",
    "file_digest",
    "file_sha256",
    "check_belongs",
    "find_layout",
    "find_layout_file",
    "layout_path_for",
    "nest",
    "path_keys",
    "plan",
    "pskd_to_safetensors",
    "read_index",
    "read_layout",
    "read_layout_file",
    "recorded_digests",
    "restore",
    "safetensors_to_pskd",
    "save",
    "save_distributed",
    "verify_directory",
    "verify_file",
]
