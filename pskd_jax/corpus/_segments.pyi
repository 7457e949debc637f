# The compiled scan of pskd_jax/corpus/_segments.c (built where a C compiler is found; see setup.py).
# inputs and outputs: objects with the buffer protocol (numpy arrays), C-contiguous. Returns whether
# every input token is below bound.

def fill(inputs: object, boundary: int, seq: int, outputs: object, bound: int, /) -> bool: ...
