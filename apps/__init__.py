"""The ``pskd`` command line: absl apps, thin layers over :mod:`pskd_jax`."""
