"""The toolkit's private plumbing between it and the operating system.

Do not import these modules from outside ``pskd_jax``: they change without notice. Each low-level
job has one home here, used by every part of the toolkit:

- :mod:`names`: every on-disk name the toolkit gives a file, built and recognised in one place;
- :mod:`files`: opening inputs (regular files only) and outputs;
- :mod:`atomic`: output that replaces its destination whole or not at all;
- :mod:`locks`: lock files held with ``flock``;
- :mod:`positional`: positional reads and writes that finish or say why not;
- :mod:`digests`: digests of whole files and of byte streams;
- :mod:`jsonfile`: strict JSON for the toolkit's own files;
- :mod:`checks`: the small checks and message pieces (mode words, integers in a range, abridged
  values, the first bad element, the bound message).
"""


__all__: list[str] = []
