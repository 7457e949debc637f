"""Checkpoints: any pytree saved as one ``.psk.d`` sample and restored exactly, a directory of them
by step (:class:`CheckpointManager`), and conversion to and from safetensors. What is kept, how a
restore matches a target, and how a directory is kept are in ``docs/checkpoints.md``.

JAX is imported only when a restore makes device arrays.
"""

from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.index import CheckpointEntry, read_index
from pskd_jax.checkpoint.integrity import CHECKPOINT_DIGEST
from pskd_jax.checkpoint.manager import CheckpointManager, ManagerState
from pskd_jax.checkpoint.options import SaveOptions
from pskd_jax.checkpoint.planning import SavePlan, SaveResult, plan
from pskd_jax.checkpoint.restoring import restore
from pskd_jax.checkpoint.retention import Retention
from pskd_jax.checkpoint.safetensors import convert, pskd_to_safetensors, safetensors_to_pskd
from pskd_jax.checkpoint.saving import save
from pskd_jax.checkpoint.verification import recorded_digests, verify_directory, verify_file
from pskd_jax.format.layout_file import LayoutFile, check_belongs, find_layout_file, read_layout_file

__all__ = [
    "CHECKPOINT_DIGEST",
    "CheckpointEntry",
    "CheckpointManager",
    "LayoutFile",
    "ManagerState",
    "Retention",
    "SaveOptions",
    "SavePlan",
    "SaveResult",
    "check_belongs",
    "convert",
    "find_layout_file",
    "plan",
    "pskd_to_safetensors",
    "read_index",
    "read_layout_file",
    "recorded_digests",
    "restore",
    "safetensors_to_pskd",
    "save",
    "save_distributed",
    "verify_directory",
    "verify_file",
]
