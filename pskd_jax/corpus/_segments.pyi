# The compiled scan of pskd_jax/corpus/_segments.c (built where a C compiler is found; see setup.py).
# inputs and outputs: objects with the buffer protocol (numpy arrays), C-contiguous. Returns whether
# every input token is below bound.

VECTOR_BYTES: int  # the vectors' width the scan uses unless asked: 32 (AVX2), 16, or 0 (token by token)

def fill(inputs: object, boundary: int, seq: int, outputs: object, bound: int, vector_bytes: int = ..., /) -> bool: ...
