"""The one compiled part: the packed segments' scan (pskd_jax/corpus/_segments.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler (or no
Python headers) is found the build goes on without it, and pskd_jax.corpus.segments computes the
same arrays with numpy, more slowly.
"""

import sys

from setuptools import Extension, setup

# -O3: the scan's small fixed loops over its 16-byte vectors unrolled and inlined.
FLAGS = [] if sys.platform == "win32" else ["-O3"]

setup(ext_modules=[Extension("pskd_jax.corpus._segments", ["pskd_jax/corpus/_segments.c"], optional=True,
                             extra_compile_args=FLAGS)])
