"""The toolkit's private plumbing between it and the operating system: one module a low-level job.

Do not import these modules from outside ``pskd_jax``: they change without notice. :mod:`names`
(every on-disk name), :mod:`files` (inputs), :mod:`atomic` (outputs), :mod:`locks`,
:mod:`positional` (positional I/O), :mod:`digests`, :mod:`jsonfile` (strict JSON), :mod:`checks`
(the small shared checks) and :mod:`interrupts` (a Ctrl-C a library swallowed); what they promise
is ``docs/files.md``.
"""


__all__: list[str] = []
