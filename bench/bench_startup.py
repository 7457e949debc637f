"""What every ``pskd`` command pays before it starts: the interpreter and the package's imports,
each a whole process, timed from outside, interleaved (A B C A B C …).

    python bench/bench_startup.py [--rounds 9]

- A: ``python -c pass`` (the interpreter alone);
- B: ``python -c "import numpy"`` (the one library every data command needs);
- C: ``python -c "import pskd_jax.apps.pskd"`` (the entry point: absl and the parser's code; no
  command's module, and so no numpy);
- D: ``pskd --version`` (every command's parser is built: each command group's module imported);
- E: ``pskd corpus build --help`` (one command's start-up: its group's modules, what they import,
  its parser, exit).

Prints each side's median with its min–max and E - B, what the toolkit's own modules add to a
command beyond numpy. No goal
of its own: it is the fixed cost in the corpus build's whole-process figure
(``bench_hf_build.py --process``). ml_dtypes, tqdm, JAX and the package metadata are imported
where first needed (``tests/test_structure.py`` checks that the command does not load them).
The package's bytecode is cached (written on the warm-up run), as an install has it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interleaved import load_text, process_times, seconds_text  # noqa: E402

ROOT = os.path.dirname(HERE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package runs: bytecode cached
    py = sys.executable
    commands = {
        "A python -c pass": [py, "-c", "pass"],
        "B import numpy": [py, "-c", "import numpy"],
        "C import pskd_jax.apps.pskd": [py, "-c", "import pskd_jax.apps.pskd"],
        "D pskd --version": [py, "-m", "pskd_jax.apps.pskd", "--version"],
        "E pskd corpus build --help": [py, "-m", "pskd_jax.apps.pskd", "corpus", "build", "--help"],
    }
    print(f"start-up, whole processes, {args.rounds} rounds interleaved, median (min–max); {load_text()}")
    times = process_times(commands, args.rounds, env={"PYTHONPATH": ROOT})
    for name, values in times.items():
        print(f"  {name:32s} {seconds_text(values)}")
    own = statistics.median(times["E pskd corpus build --help"]) - statistics.median(times["B import numpy"])
    print(f"  the toolkit's own part of a command's start-up (E - B): {own:.3f} s")
    print(f"({load_text()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
