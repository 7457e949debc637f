"""The epoch shuffle: ChaCha20 round keys and a keyed Feistel permutation with cycle walking.

The order of epoch ``e`` over ``n`` samples is a permutation of ``0..n-1``, a pure function of
``(seed, epoch, n)``, the same on every machine and computable at any position in constant memory.
Its definition and test vectors are ``docs/pipeline.md`` ("The shuffle"); how :class:`Permutation`
evaluates it fast is said in its docstring. ChaCha20 (RFC 8439 §2.3) is plain Python: it runs once
per ``(seed, epoch)``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import struct
from typing import Any

import numpy as np

from pskd_jax.errors import BadValueError

__all__ = [
    "HELD_PERMUTATIONS",
    "MAX_N",
    "MAX_SEED",
    "STACKED_TABLE_ENTRIES",
    "Permutation",
    "chacha20_block",
    "check_epoch",
    "check_n",
    "check_seed",
    "fmix32",
    "half_bits",
    "held_permutation",
    "permute_together",
    "round_keys",
    "shuffle_order",
]

KEY_TAG = b"pskd.shuffle.v1\0"
ROUNDS = 8
FMIX_C1 = 0x7FEB352D
FMIX_C2 = 0x846CA68B
MASK32 = 0xFFFFFFFF
MAX_SEED = 2**64  # exclusive: seed and epoch are written as u64
MAX_N = 2**64  # positions are u64

CHUNK = 1 << 16  # positions per vectorised step: a few int64 arrays of it stay in cache
LANE_LIMIT = 256  # arrays up to this size run through the big-integer lanes
TABLE_LANE_LIMIT = 32  # the same once round tables make a numpy pass cheap
REPACK_AFTER = 16  # finished lanes that make a walk repack its walkers
TABLE_MAX_HALF_BITS = 16  # round tables of at most 8 × 2^16 entries (4 MiB)

_CHACHA_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)


# --- ChaCha20 (RFC 8439 §2.3) ------------------------------------------------------------------


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK32


def _quarter_round(s: list[int], a: int, b: int, c: int, d: int) -> None:
    """RFC 8439 §2.1 applied to the state words a, b, c, d in place."""
    s[a] = (s[a] + s[b]) & MASK32
    s[d] = _rotl32(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & MASK32
    s[b] = _rotl32(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & MASK32
    s[d] = _rotl32(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & MASK32
    s[b] = _rotl32(s[b] ^ s[c], 7)


def chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """The 64-byte ChaCha20 block of RFC 8439 §2.3 for a 32-byte key, u32 counter, 12-byte nonce.

    >>> chacha20_block(bytes(32), 0, bytes(12))[:8].hex()
    '76b8e0ada0f13d90'
    """
    if len(key) != 32 or len(nonce) != 12 or not 0 <= counter <= MASK32:
        raise ValueError("ChaCha20 takes a 32-byte key, a u32 counter and a 12-byte nonce")
    initial = [*_CHACHA_CONSTANTS, *struct.unpack("<8I", key), counter, *struct.unpack("<3I", nonce)]
    s = list(initial)
    for _ in range(10):  # 20 rounds: a column round and a diagonal round each time
        _quarter_round(s, 0, 4, 8, 12)
        _quarter_round(s, 1, 5, 9, 13)
        _quarter_round(s, 2, 6, 10, 14)
        _quarter_round(s, 3, 7, 11, 15)
        _quarter_round(s, 0, 5, 10, 15)
        _quarter_round(s, 1, 6, 11, 12)
        _quarter_round(s, 2, 7, 8, 13)
        _quarter_round(s, 3, 4, 9, 14)
    return struct.pack("<16I", *((x + y) & MASK32 for x, y in zip(s, initial)))


# --- key derivation and the scalar reference -------------------------------------------------


def round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    """The eight u32 Feistel round keys of ``(seed, epoch)``: ChaCha20 keyed by seed, epoch, tag.

    >>> len(round_keys(0, 1))
    8
    """
    key = seed.to_bytes(8, "little") + epoch.to_bytes(8, "little") + KEY_TAG
    return struct.unpack("<8I", chacha20_block(key, 0, bytes(12))[:32])


def fmix32(x: int) -> int:
    """The round function before keying and masking: MurmurHash3's finalizer shape with the
    constants of Chris Wellons' "lowbias32" (``fmix`` in docs/pipeline.md).

    >>> hex(fmix32(1))
    '0x688990c0'
    """
    x ^= x >> 16
    x = (x * FMIX_C1) & MASK32
    x ^= x >> 15
    x = (x * FMIX_C2) & MASK32
    return x ^ (x >> 16)


def half_bits(n: int) -> int:
    """h for a domain of n positions: half of b = max(2, bit_length(n - 1)) rounded up to even.

    >>> half_bits(10), half_bits(2**40), half_bits(2**38 + 1), half_bits(2**64)
    (2, 20, 20, 32)
    """
    b = max(2, (n - 1).bit_length())
    return (b + (b & 1)) // 2


# --- argument checks ------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int, high: int, accepted: str) -> int:
    """``value`` as a Python int in [low, high), or a PskdError saying what is accepted."""
    if isinstance(value, (bool, np.bool_)):
        raise BadValueError(f"{name} must be {accepted}, got {name}={value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise BadValueError(f"{name} must be {accepted}, got {name}={value!r}") from None
    if not low <= number < high:
        raise BadValueError(f"{name} must be {accepted}, got {name}={number}")
    return number


def check_seed(seed: Any) -> int:
    """The seed as an int in [0, 2**64), or E9004 naming the accepted range."""
    return _check_int("seed", seed, 0, MAX_SEED, "an integer in [0, 2**64)")


def check_epoch(epoch: Any) -> int:
    """The epoch as an int in [1, 2**64): epochs are numbered from 1."""
    return _check_int("epoch", epoch, 1, MAX_SEED, "an integer in [1, 2**64) (epochs count from 1)")


def check_n(n: Any) -> int:
    """The number of samples as an int in [1, 2**64]."""
    return _check_int("n", n, 1, MAX_N + 1, "an integer in [1, 2**64] (the number of samples)")


def _lane_count(k: int) -> int:
    """k rounded up to a number with at most three significant bits.

    Lane constants are cached per lane count; rounding keeps that cache to four sizes an octave
    while the padding lanes waste at most a quarter of the work.

    >>> [_lane_count(k) for k in (1, 7, 9, 129, 255)]
    [1, 7, 10, 160, 256]
    """
    step = 1 << max(0, k.bit_length() - 3)
    return -(-k // step) * step


# --- the permutation --------------------------------------------------------------------------


class Permutation:
    """π_epoch over ``0..n-1`` for one ``(seed, epoch)``, keys derived once.

    Calling it maps an array of positions to the samples they hold; :meth:`order` gives a run of
    consecutive positions; :meth:`at` is the scalar reference, written straight from the
    pseudo-code. Values come back as int64 when ``n <= 2**63`` (every sample index fits), as
    uint64 otherwise. One instance may serve several threads: its caches (lane constants, round
    tables) only ever gain entries, and any of them gives the same numbers.

    Three evaluations of the cipher E give the same numbers (the tests hold each to :meth:`at`);
    which one runs is a matter of speed only:

    * **tables** (``h <= 16``): each round function ``fmix(R ^ k[r]) & m`` is tabulated over all
      ``2^h`` values of R once the permutation has been asked for about that many positions, so a
      round is one gather and one xor;
    * **lanes** (small arrays, and the last walkers of any array): the values are packed as 64-bit
      lanes (128-bit when ``b > 62``) of one Python integer and every step of a round is one
      big-integer operation on all lanes at once: a numpy ufunc call has a fixed cost whatever the
      size of a small array, and a round is eleven of them. The walkers stay packed from step to
      step and leave the integer only when enough of them are done, so the few positions that walk
      twenty times cost twenty cheap steps, not twenty numpy passes;
    * **numpy rounds** (large arrays, ``h > 16``): eleven in-place uint32 ufunc calls a round.

    Whole orders are produced in chunks of :data:`CHUNK` positions, so the memory beyond the output
    is a few arrays of one chunk.

    >>> Permutation(10, seed=0, epoch=1).order().tolist()
    [2, 4, 5, 6, 8, 7, 0, 9, 1, 3]
    >>> Permutation(10, seed=0, epoch=1).at(4)
    8
    """

    def __init__(self, n: int, *, seed: int, epoch: int):
        self.n = check_n(n)
        self.seed = check_seed(seed)
        self.epoch = check_epoch(epoch)
        self.keys = round_keys(self.seed, self.epoch)
        self.half_bits = half_bits(self.n)
        self.dtype = np.dtype(np.int64) if self.n <= 2**63 else np.dtype(np.uint64)
        h = self.half_bits
        self._mask = (1 << h) - 1
        # The domain 2^b exceeds n unless n is a power of four (or 2^64): only then is there a walk.
        self._walks = self.n < 1 << (2 * h)
        # 0-d arrays of the operand dtype are the cheapest ufunc operands (no scalar conversion).
        self._n64 = np.array(min(self.n, MAX_N - 1), dtype=np.uint64)
        self._h64 = np.array(h, dtype=np.uint64)
        self._m64 = np.array(self._mask, dtype=np.uint64)
        self._m32 = np.array(self._mask, dtype=np.uint32)
        self._k32 = tuple(np.array(k, dtype=np.uint32) for k in self.keys)
        # 64-bit lanes while y + 2^63 - n cannot carry out of a lane (b <= 62), else 128-bit.
        self._lane_bytes = 8 if 2 * h <= 62 else 16
        self._lanes: dict[int, _LaneConstants] = {}
        self._tables: np.ndarray | None = None
        self._table_rows: tuple[np.ndarray, ...] = ()  # the tables' rows, once built
        self._asked = 0  # positions encrypted so far, to decide when tables pay for themselves

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    # scalar reference

    def encrypt(self, x: int) -> int:
        """E(x) for one x in ``0..2^b-1``, in Python integers."""
        h, m = self.half_bits, self._mask
        left, right = x >> h, x & m
        for k in self.keys:
            left, right = right, left ^ (fmix32(right ^ k) & m)
        return (left << h) | right

    def at(self, position: int) -> int:
        """π(position), the scalar reference of the vectorised evaluation."""
        p = _check_int("position", position, 0, self.n, f"an integer in [0, {self.n})")
        if self.n == 1:
            return 0
        y = self.encrypt(p)
        while y >= self.n:
            y = self.encrypt(y)
        return y

    # vectorised

    def __call__(self, positions: Any) -> np.ndarray:
        """π at every element of an integer array of positions in ``0..n-1``; same shape."""
        p = self._check_positions(positions)
        flat = p.reshape(-1)
        if flat.size <= CHUNK:
            return self._permute(flat).reshape(p.shape).view(self.dtype)
        out = np.empty(flat.size, dtype=np.uint64)
        for lo in range(0, flat.size, CHUNK):
            hi = min(lo + CHUNK, flat.size)
            out[lo:hi] = self._permute(flat[lo:hi])
        return out.reshape(p.shape).view(self.dtype)

    def order(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """π(start), …, π(stop - 1): a slice of the epoch's order, chunk by chunk."""
        start, stop = _check_range(self.n, start, stop)
        out = np.empty(stop - start, dtype=np.uint64)
        for lo in range(start, stop, CHUNK):
            hi = min(lo + CHUNK, stop)
            positions = np.arange(lo - start, hi - start, dtype=np.uint64)
            positions += np.uint64(start)  # arange cannot start at or beyond 2**63 by itself
            out[lo - start : hi - start] = self._permute(positions)
        return out.view(self.dtype)

    def _check_positions(self, positions: Any) -> np.ndarray:
        """The positions as uint64 after checking they are integers in ``0..n-1``."""
        p = np.asarray(positions)
        if not p.size:
            return p.astype(np.uint64)  # an empty list arrives as float64
        if p.dtype.kind not in "iu":
            raise BadValueError(f"positions must be an integer array, got dtype {p.dtype}")
        u = p.astype(np.uint64, copy=False)
        # A negative position wraps to 2^64 - |p|, at or above n unless n > 2^63.
        too_big = self.n < MAX_N and bool((u >= self._n64).any())
        negative = self.n > 2**63 and p.dtype.kind == "i" and bool((p < 0).any())
        if too_big or negative:
            flat, wrapped = p.reshape(-1), u.reshape(-1)
            bad = (flat < 0) | (wrapped >= self._n64) if self.n < MAX_N else flat < 0
            raise BadValueError(f"positions must be in [0, {self.n}), got {flat[np.flatnonzero(bad)[0]]}")
        return u

    def _permute(self, positions: np.ndarray) -> np.ndarray:
        """π of a 1-d uint64 array as a new uint64 array."""
        if self.n == 1:
            return np.zeros(positions.size, dtype=np.uint64)
        self._asked += positions.size
        if self._tables is None and self.half_bits <= TABLE_MAX_HALF_BITS and self._asked >= 1 << self.half_bits:
            # Building the tables costs about as much as encrypting 2^h positions.
            self._make_tables()
        # A numpy pass costs the same for any small array, a pass in lanes grows with the lanes.
        lane_limit = LANE_LIMIT if self._tables is None else TABLE_LANE_LIMIT
        if positions.size <= lane_limit:
            y = positions.astype(np.uint64)
            self._walk_lanes(y, np.arange(y.size))
            return y
        y = self._encrypt(positions)
        active = np.flatnonzero(y >= self._n64) if self._walks else np.empty(0, dtype=np.intp)
        while active.size > lane_limit:
            # Only the positions still outside 0..n-1 take the next step.
            walked = self._encrypt(y.take(active))
            y[active] = walked
            active = active[walked >= self._n64]
        if active.size:
            self._walk_lanes(y, active)
        return y

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        """E of a 1-d uint64 array as a new uint64 array, with numpy ufuncs."""
        return self._encrypt_rounds(x) if self._tables is None else self._encrypt_tables(x)

    def _make_tables(self) -> None:
        """Builds the round tables (their rows first: whoever sees the tables sees the rows)."""
        tables = self._build_tables()
        self._table_rows = tuple(tables)
        self._tables = tables

    def _build_tables(self) -> np.ndarray:
        """tables[r, R] = fmix(R ^ k[r]) & m for every R in 0..2^h-1, as intp."""
        right = np.arange(1 << self.half_bits, dtype=np.uint32)
        tables = np.empty((ROUNDS, right.size), dtype=np.intp)
        scratch = np.empty_like(right)
        for r, k in enumerate(self._k32):
            t = np.bitwise_xor(right, k)
            _fmix_inplace(t, scratch)
            np.bitwise_and(t, self._m32, t)
            tables[r] = t
        return tables

    def _encrypt_tables(self, x: np.ndarray) -> np.ndarray:
        """E with one gather and one xor a round (values below 2^32, so intp holds them)."""
        assert self._tables is not None
        xi = x.view(np.int64)
        left = np.right_shift(xi, self.half_bits)
        right = np.bitwise_and(xi, self._mask)
        t = np.empty_like(left)
        for table in self._tables:
            table.take(right, out=t, mode="clip")  # 'clip': no bounds pass, R < 2^h already
            np.bitwise_xor(t, left, t)
            left, right, t = right, t, left
        np.left_shift(left, self.half_bits, left)
        np.bitwise_or(left, right, left)
        return left.view(np.uint64)

    def _encrypt_rounds(self, x: np.ndarray) -> np.ndarray:
        """E with in-place uint32 ufuncs, positional ``out`` (cheaper to call than ``out=``)."""
        xor = np.bitwise_xor
        left = np.right_shift(x, self._h64).astype(np.uint32)
        right = np.bitwise_and(x, self._m64).astype(np.uint32)
        t, u = np.empty_like(left), np.empty_like(left)
        masked = self.half_bits < 32
        for k in self._k32:
            xor(right, k, t)
            _fmix_inplace(t, u)
            if masked:
                np.bitwise_and(t, self._m32, t)
            xor(t, left, t)
            left, right, t = right, t, left
        y = left.astype(np.uint64)
        np.left_shift(y, self._h64, y)
        np.bitwise_or(y, right, y)
        return y

    # big-integer lanes

    def _lane_constants(self, lanes: int) -> _LaneConstants:
        """The constants of :meth:`_encrypt_packed` and :meth:`_walk_lanes` for ``lanes`` lanes."""
        constants = self._lanes.get(lanes)
        if constants is None:
            ones = int.from_bytes((b"\1" + bytes(self._lane_bytes - 1)) * lanes, "little")
            constants = _LaneConstants(
                ones=ones,
                mask=ones * self._mask,
                mask32=ones * MASK32,
                keys=tuple(ones * k for k in self.keys),
                # y + 2^(W-1) - n has its top lane bit set iff y >= n, and no carry leaves the
                # lane because y < 2^b <= 2^(W-2).
                offset=ones * ((1 << (8 * self._lane_bytes - 1)) - self.n),
            )
            self._lanes[lanes] = constants
        return constants

    def _pack(self, x: np.ndarray) -> int:
        """The values of a uint64 array as consecutive lanes of one integer, lane 0 lowest."""
        if self._lane_bytes == 8:
            return int.from_bytes(x.astype("<u8", copy=False).tobytes(), "little")
        words = np.zeros((x.size, self._lane_bytes // 8), dtype="<u8")
        words[:, 0] = x
        return int.from_bytes(words.tobytes(), "little")

    def _unpack(self, packed: int, count: int, lanes: int) -> np.ndarray:
        """The first ``count`` of the ``lanes`` lanes of ``packed`` as a new uint64 array."""
        raw = packed.to_bytes(self._lane_bytes * lanes, "little")
        words = np.frombuffer(raw, dtype="<u8", count=count * self._lane_bytes // 8)
        return words[:: self._lane_bytes // 8].astype(np.uint64)

    def _encrypt_packed(self, packed: int, c: _LaneConstants) -> int:
        """E of every lane of ``packed`` (lanes beyond the values given are zero).

        Each lane holds at most 32 significant bits before a multiplication, so a product by a
        32-bit constant stays inside its lane; a right shift drags the next lane's low bits into
        the top of this one, and the mask that follows every shift clears them.
        """
        h, mask, mask32 = self.half_bits, c.mask, c.mask32
        left, right = (packed >> h) & mask, packed & mask
        for k in c.keys:
            t = right ^ k
            t = (t ^ (t >> 16)) & mask32
            t = (t * FMIX_C1) & mask32
            t = (t ^ (t >> 15)) & mask32
            t = (t * FMIX_C2) & mask32
            t = (t ^ (t >> 16)) & mask
            left, right = right, left ^ t
        return (left << h) | right

    def _walk_lanes(self, y: np.ndarray, active: np.ndarray) -> None:
        """Applies E to ``y[active]`` in place once, then again wherever the value is >= n.

        The values stay packed from step to step: a step encrypts every lane, keeps the result
        only in the lanes still walking, and tests all lanes against n at once. Lanes that are
        done still cost work, so once :data:`REPACK_AFTER` of them are done the walkers are
        repacked without them.
        """
        top = 8 * self._lane_bytes - 1
        while active.size:
            count = active.size
            lanes = _lane_count(count)
            c = self._lane_constants(lanes)
            packed = self._pack(y.take(active))
            walking = c.ones & ((1 << ((top + 1) * count)) - 1)  # bit 0 of each lane that walks
            while walking:
                moved = self._encrypt_packed(packed, c)
                keep = (walking << (top + 1)) - walking  # all ones in the walking lanes
                packed ^= (moved ^ packed) & keep
                walking &= (packed + c.offset) >> top
                if count - walking.bit_count() >= REPACK_AFTER:
                    break
            values = self._unpack(packed, count, lanes)
            y[active] = values
            active = active[values >= self._n64]


@dataclasses.dataclass(frozen=True)
class _LaneConstants:
    """Numbers replicated into every lane: bit 0, m, 2^32-1, the round keys, 2^(W-1) - n."""

    ones: int
    mask: int
    mask32: int
    keys: tuple[int, ...]
    offset: int


def _fmix_inplace(t: np.ndarray, scratch: np.ndarray) -> None:
    """fmix32 of a uint32 array in place (uint32 products wrap mod 2^32, as fmix wants)."""
    xor, shr, mul = np.bitwise_xor, np.right_shift, np.multiply
    shr(t, _S16, scratch)
    xor(t, scratch, t)
    mul(t, _C1, t)
    shr(t, _S15, scratch)
    xor(t, scratch, t)
    mul(t, _C2, t)
    shr(t, _S16, scratch)
    xor(t, scratch, t)


_S15 = np.array(15, dtype=np.uint32)
_S16 = np.array(16, dtype=np.uint32)
_C1 = np.array(FMIX_C1, dtype=np.uint32)
_C2 = np.array(FMIX_C2, dtype=np.uint32)


def _check_range(n: int, start: Any, stop: Any) -> tuple[int, int]:
    """(start, stop) as ints with 0 <= start <= stop <= n; stop None means n."""
    stop = n if stop is None else _check_int("stop", stop, 0, MAX_N + 1, f"an integer in [0, {n}]")
    start = _check_int("start", start, 0, MAX_N + 1, f"an integer in [0, {n}]")
    if not start <= stop <= n:
        raise BadValueError(f"need 0 <= start <= stop <= n={n}, got start={start}, stop={stop}")
    return start, stop


#: Permutations kept by :func:`held_permutation`: a few epochs of a few files.
HELD_PERMUTATIONS = 16


@functools.lru_cache(maxsize=HELD_PERMUTATIONS)
def _held(n: int, seed: int, epoch: int) -> Permutation:
    return Permutation(n, seed=seed, epoch=epoch)


def held_permutation(n: int, *, seed: int, epoch: int) -> Permutation:
    """The :class:`Permutation` of ``(n, seed, epoch)``, kept between calls.

    Deriving the round keys (a ChaCha20 block in Python) costs more than permuting a batch, so
    code that asks for one batch at a time must not derive them per call: the last
    :data:`HELD_PERMUTATIONS` permutations asked for are kept (a Permutation is safe to share
    between threads). Arguments are checked first, so ``np.int64(10)`` and ``10`` share one.
    """
    return _held(check_n(n), check_seed(seed), check_epoch(epoch))


def shuffle_order(n: int, *, seed: int, epoch: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """π_epoch(p) for p in ``start..stop-1`` (default the whole epoch) over ``n`` samples.

    int64 when ``n <= 2**63``, else uint64. Memory beyond the result is one chunk's worth. The
    round keys of ``(seed, epoch)`` are derived once and kept (:func:`held_permutation`), so a
    call per batch costs about what a call on a held :class:`Permutation` costs.

    >>> shuffle_order(10, seed=0, epoch=2).tolist()
    [9, 1, 3, 6, 8, 0, 7, 2, 5, 4]
    >>> shuffle_order(1000, seed=42, epoch=1, stop=4).tolist()
    [156, 421, 538, 754]
    """
    return held_permutation(n, seed=seed, epoch=epoch).order(start, stop)


#: The most table entries (sources × 2^h) :func:`permute_together` stacks; beyond, one pass a source.
STACKED_TABLE_ENTRIES = 1 << 20
#: Walkers :func:`permute_together` finishes one by one in Python integers (a step is eight
#: table look-ups), where more of them take another numpy pass first.
SCALAR_WALKERS = 24


def permute_together(permutations: tuple[Permutation, ...], which: np.ndarray, positions: np.ndarray
                     ) -> np.ndarray | None:
    """``permutations[which[i]](positions[i])`` for every i, as int64, in one pass over all the
    positions: their round tables stacked, each position tagged with its permutation's number
    above its half-words (a table gather then lands in its own table's rows, and the tag rides
    along through the xors). Positions that walk take more such passes while there are many of
    them, and the last few finish one by one in Python integers with their own permutation's
    tables (eight look-ups a step). ``None`` where the pass does not apply (a permutation without its tables yet, ``h``
    over 16, n over 2**63, or more stacked entries than :data:`STACKED_TABLE_ENTRIES`): the
    caller then evaluates each permutation by itself. ``positions`` are int64 in ``0..n-1`` of
    their permutation (unchecked); the numbers are those of calling each permutation.
    """
    stack = _stacks.get(permutations)
    if stack is None:
        for p in permutations:
            p._asked += positions.size // len(permutations)
            if p._tables is None and p.half_bits <= TABLE_MAX_HALF_BITS and p._asked >= 1 << p.half_bits:
                p._make_tables()
        if any(p._tables is None or p.n > 2**63 or p.n == 1 for p in permutations):
            return None
        top = max(p.half_bits for p in permutations)
        if len(permutations) << top > STACKED_TABLE_ENTRIES:
            return None
        stack = _stack(permutations, top)
    tables, n, h_each, top = stack
    if h_each is None:
        h: Any = permutations[0].half_bits
        mask: Any = (1 << h) - 1
    else:
        h = h_each.take(which)
        mask = np.left_shift(1, h)
        mask -= 1
    y = _encrypt_stacked(tables, positions, np.left_shift(which, top), h, mask)
    walking = (y >= n.take(which)).nonzero()[0]
    while walking.size > SCALAR_WALKERS:  # (many walkers: another pass over them alone)
        owners = which.take(walking)
        h_w, mask_w = (h, mask) if h_each is None else (h.take(walking), mask.take(walking))
        walked = _encrypt_stacked(tables, y.take(walking), np.left_shift(owners, top), h_w, mask_w)
        y[walking] = walked
        walking = walking[walked >= n.take(owners)]
    if walking.size:
        for row, k in zip(walking.tolist(), which.take(walking).tolist()):
            y[row] = _walk_with_tables(permutations[k], int(y[row]))
    return y


def _walk_with_tables(p: Permutation, y: int) -> int:
    """E applied to y (>= n) until it is below n, in Python integers with the round tables."""
    assert p._tables is not None
    h, m, rounds = p.half_bits, p._mask, p._table_rows
    while y >= p.n:
        left, right = y >> h, y & m
        for table in rounds:
            left, right = right, left ^ table.item(right)
        y = (left << h) | right
    return y


def _encrypt_stacked(tables: np.ndarray, x: np.ndarray, tag: np.ndarray, h: Any, mask: Any) -> np.ndarray:
    """E of each of ``x`` (int64) with the table rows its tag picks, as a new int64 array."""
    left = np.right_shift(x, h)
    left |= tag
    right = np.bitwise_and(x, mask)
    right |= tag
    t = np.empty_like(left)
    for table in tables:
        table.take(right, out=t, mode="clip")  # (below the stack's size: no bounds pass)
        np.bitwise_xor(t, left, t)
        left, right, t = right, t, left
    left &= mask
    left <<= h
    right &= mask
    left |= right
    return left


_Stack = tuple[np.ndarray, np.ndarray, "np.ndarray | None", int]


def _stack(permutations: tuple[Permutation, ...], top: int) -> _Stack:
    """The permutations' round tables side by side, 2^top entries apart; their n (int64); their
    half-word bits (int64), or None when they share one; and top. Kept for the last few."""
    tables = np.zeros((ROUNDS, len(permutations) << top), dtype=np.intp)
    for k, p in enumerate(permutations):
        assert p._tables is not None
        tables[:, k << top : (k << top) + p._tables.shape[1]] = p._tables
    n = np.array([p.n for p in permutations], dtype=np.int64)
    h = np.array([p.half_bits for p in permutations], dtype=np.int64)
    stack = (tables, n, None if (h == top).all() else h, top)
    if len(_stacks) >= HELD_STACKS:
        _stacks.pop(next(iter(_stacks)), None)
    _stacks[permutations] = stack
    return stack


HELD_STACKS = 4  # stacks of tables kept by _stacked_tables
_stacks: dict[tuple[Permutation, ...], _Stack] = {}  # (by the permutations themselves)
