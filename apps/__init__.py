"""The ``pskd`` command line: absl apps, thin layers over :mod:`pskd_jax`."""


__all__: list[str] = []
