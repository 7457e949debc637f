"""``python tests/workers/train_lm_killed.py STEP ARGS…``: train_lm with ARGS, killed with SIGKILL
in the middle of the asynchronous save of step STEP (the save started, its file being written).

Nothing of the process runs after the signal, as when a machine loses power or a scheduler
preempts the job: the resumed run must still equal one that was never interrupted.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    kill_at = int(sys.argv[1])
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    from pskd_jax.checkpoint import manager

    save_async = manager.CheckpointManager.save_async

    def killing(self, step, *args, **kwargs):
        result = save_async(self, step, *args, **kwargs)
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    manager.CheckpointManager.save_async = killing  # type: ignore[method-assign]
    from pskd_jax.apps import train_lm

    train_lm.run()


if __name__ == "__main__":
    main()
