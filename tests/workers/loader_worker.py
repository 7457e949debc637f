"""A JAX process of a multi-process loader test: ``python loader_worker.py ID N PORT FILE OUT``.

Each process initialises JAX's distributed runtime on CPU (two host devices each), loads the
first batches of a pipeline sharded along the batch axis over every device of every process, and
writes what it gathered and what its shards hold to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    process_id, processes, port, data, out = sys.argv[1:6]
    resume = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=int(processes), process_id=int(process_id)
    )
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import pskd_jax
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline.batches import IteratorState
    from pskd_jax.pipeline.parse import parse_pipeline

    class RecordingReader(pskd_jax.Reader):
        gathered: list[list[int]] = []

        def gather(self, indices):
            self.gathered.append(np.asarray(indices).tolist())
            return super().gather(indices)

    reader = RecordingReader(data)
    pipeline = parse_pipeline(f'stream "{data}" |> shuffle(seed = 3) |> batch(B = 8)')
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    state = IteratorState.from_json(resume) if resume else None
    batches, states = [], []
    with Loader(reader, pipeline, sharding=sharding, state=state) as loader:
        for step, (tokens, _values) in enumerate(loader):
            whole = multihost_utils.process_allgather(tokens, tiled=True)
            batches.append(np.asarray(whole).tolist())
            states.append(loader.state.to_json())
            if step == 4:
                break
    with open(out, "w") as f:
        json.dump({"gathered": RecordingReader.gathered, "batches": batches, "states": states}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
