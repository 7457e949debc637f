/* Packed segments of a batch of windows in one pass: pskd_jax.corpus.segments, compiled.

   fill(inputs, boundary, seq, outputs, bound[, vector_bytes]) writes each input token's segment
   id, then each one's position (the rules in segments.py), into the output buffer: its first
   half the ids, its second the positions. It returns whether every input token is below bound:
   a corpus's gather checks its tokens against the vocabulary size, and the check rides in the
   same pass (one compare a vector more) instead of a pass of its own over the batch. The inputs
   are C-contiguous unsigned tokens of 1, 2 or 4 bytes, a whole number of windows of seq tokens;
   the outputs C-contiguous signed integers of 2 or 4 bytes, twice as many. The caller
   (segments.py) chooses the types; this module checks what keeps it inside the buffers.

   gather(...) is a mapped corpus's gather of windows with the same scan (or the check alone)
   run on each window as it is copied (see it below).

   Why compiled: numpy needs several passes and a dozen calls for what is one scan, and a
   Loader gathers batches of 64 Ki tokens in well under a hundred microseconds. The scan takes
   the tokens a block of 32 at a time (see DEFINE_SCAN); only the last few tokens of a window
   that is not whole blocks go one by one. The GIL is let go during the scan, so a Loader's
   thread overlaps it with the training step. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The scan of one token: its id and position, then the next token's; whether it is above largest. */
#define STEP(t)                                                                                \
    do {                                                                                       \
        ids[t] = id;                                                                           \
        pos[t] = at;                                                                           \
        if (in[t] == boundary) { id++; at = 0; } else { at++; }                                \
        over |= in[t] > largest;                                                               \
    } while (0)

#if defined(__GNUC__) && !defined(PSKD_SEGMENTS_BY_TOKEN)
/* With GCC's vector types (gcc, clang), in vectors of VB bytes: each scan is built twice, in
   vectors of 16 bytes (the width every x86-64 and arm64 processor has) and of 32, compiled for
   AVX2 on x86-64, which the module uses where the processor has AVX2 (VECTOR_BYTES). The scan is
   bound by its stores, two outputs a token: in 32-byte vectors it makes half as many (7.3 against
   5.0 us a batch of B = 64, T = 1024 u16 tokens on an AMD EPYC; 64-byte vectors 4.6, not worth a
   third build). Each block's compares with the boundary are ORed together; the ids and positions of
   a block with no boundary (nearly all: documents are hundreds of tokens long) are two
   broadcasts; in a block holding one, each boundary (found from its compare's bits) then adds 1
   to the ids after it and restarts the positions there, lanes masked in the same vectors. A
   token above the largest allowed is found by a signed compare of both with their top bits
   flipped (SSE2 has no unsigned compare: two instructions, where the compiler's unsigned
   compare takes three), ORed across the window. */
#define BLOCK 32
#if defined(__x86_64__) || defined(__i386__)
#define WIDE __attribute__((target("avx2")))
#else
#define WIDE
#endif
static const int16_t LANES16[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
static const int32_t LANES32[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
#define LANES(OUT) (sizeof(OUT) == 2 ? (const void *)LANES16 : (const void *)LANES32)

/* Whether any of a vector's words is not 0. */
static inline uint64_t any_word(const uint64_t *words, int count) {
    uint64_t any = 0;
    for (int w = 0; w < count; w++) any |= words[w];
    return any;
}

/* NAME_marks(in, boundary, found): the places of the boundaries in a block of BLOCK tokens, in
   order, into found; how many. On x86 from one mask of the block's compares (movemask: a bit a
   byte, the lowest of each token's bytes kept), so that finding a block's one boundary costs one
   short loop, not a test of every word of every vector (each a branch the processor guesses
   wrong now and then): segments added 4.6-5.6 us to a mapped gather of B = 64, T = 1024,
   documents of ~500 tokens, against 8.2-8.9 us before (bench_segments.py, runs taken in turn).
   Elsewhere (and with PSKD_SEGMENTS_PORTABLE defined, as a test builds it) from the compares'
   words. */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(PSKD_SEGMENTS_PORTABLE)
typedef char mask_bytes16 __attribute__((vector_size(16)));
typedef char mask_bytes32 __attribute__((vector_size(32)));
#define MOVEMASK_16(v) ((uint64_t)(unsigned)__builtin_ia32_pmovmskb128((mask_bytes16)(v)))
#define MOVEMASK_32(v) ((uint64_t)(unsigned)__builtin_ia32_pmovmskb256((mask_bytes32)(v)))
#define LOWEST_BYTES(S) ((S) == 1 ? ~0ULL : (S) == 2 ? 0x5555555555555555ULL : 0x1111111111111111ULL)
#define DEFINE_MARKS(NAME, TOKEN, VB, TARGET)                                                  \
    TARGET static inline int NAME##_marks(const TOKEN *in, TOKEN boundary, int *found) {       \
        enum { S = sizeof(TOKEN), TOKENS = VB / sizeof(TOKEN), WORDS = (BLOCK * S + 63) / 64 }; \
        uint64_t marks[WORDS] = {0};                                                           \
        for (int k = 0; k < BLOCK / TOKENS; k++) {                                             \
            NAME##_tokens v;                                                                   \
            memcpy(&v, in + k * TOKENS, VB);                                                   \
            v = (NAME##_tokens)(v == boundary);                                                \
            marks[(k * VB) / 64] |= MOVEMASK_##VB(v) << ((k * VB) % 64);                       \
        }                                                                                      \
        int count = 0;                                                                         \
        for (int j = 0; j < WORDS; j++)                                                        \
            for (uint64_t word = marks[j] & LOWEST_BYTES(S); word; word &= word - 1)           \
                found[count++] = (j * 64 + __builtin_ctzll(word)) / S;                         \
        return count;                                                                          \
    }
#else
#define DEFINE_MARKS(NAME, TOKEN, VB, TARGET)                                                  \
    TARGET static inline int NAME##_marks(const TOKEN *in, TOKEN boundary, int *found) {       \
        enum { TOKENS = VB / sizeof(TOKEN), BITS = 8 * sizeof(TOKEN) };                        \
        int count = 0;                                                                         \
        for (int k = 0; k < BLOCK / TOKENS; k++) {                                             \
            NAME##_tokens v;                                                                   \
            uint64_t bits[VB / 8];                                                             \
            memcpy(&v, in + k * TOKENS, VB);                                                   \
            v = (NAME##_tokens)(v == boundary);                                                \
            memcpy(bits, &v, VB);                                                              \
            for (int w = 0; w < VB / 8; w++) {                                                 \
                for (uint64_t word = bits[w]; word; ) { /* (a boundary's lane: all ones) */    \
                    int bit = __builtin_ctzll(word);                                           \
                    found[count++] = k * TOKENS + w * (64 / BITS) + bit / BITS;                \
                    word &= ~((~0ULL >> (64 - BITS)) << bit);                                  \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        return count;                                                                          \
    }
#endif

#define DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT, VB, TARGET)                                      \
    typedef TOKEN NAME##_tokens __attribute__((vector_size(VB)));                              \
    typedef SIGNED NAME##_signed __attribute__((vector_size(VB)));                             \
    typedef OUT NAME##_outs __attribute__((vector_size(VB)));                                  \
    enum { NAME##_TOKENS = VB / sizeof(TOKEN), NAME##_OUTS = VB / sizeof(OUT) };               \
    DEFINE_MARKS(NAME, TOKEN, VB, TARGET)                                                      \
    /* The scan's state between tokens: the next token's id and position. */                \
    typedef struct { OUT id, at; } NAME##_state;                                               \
    /* A block holding a boundary, apart (rare, and its arrays would keep the common case's    \
       vectors out of registers): the ids and positions as if it held none, then for each      \
       boundary in turn the ids after it one more and the positions after it from 0. The       \
       state goes in and out by value, so that the common case keeps it in registers. */       \
    TARGET __attribute__((noinline)) static NAME##_state NAME##_split(const TOKEN *in, TOKEN boundary, \
                                                               NAME##_state s, OUT *ids, OUT *pos) { \
        enum { OUTS = NAME##_OUTS };                                                           \
        NAME##_outs lanes[BLOCK / OUTS], idv[BLOCK / OUTS], posv[BLOCK / OUTS];                \
        memcpy(lanes, LANES(OUT), sizeof lanes);                                               \
        for (int m = 0; m < BLOCK / OUTS; m++) {                                               \
            idv[m] = (NAME##_outs){0} + s.id;                                                  \
            posv[m] = lanes[m] + s.at;                                                         \
        }                                                                                      \
        int found[BLOCK], count = NAME##_marks(in, boundary, found), last = 0;                 \
        for (int b = 0; b < count; b++) {                                                      \
            last = found[b];                                                                   \
            for (int m = 0; m < BLOCK / OUTS; m++) {                                           \
                NAME##_outs after = (NAME##_outs)(lanes[m] > (OUT)last);                       \
                idv[m] -= after;                                                               \
                posv[m] = (posv[m] & ~after) | ((lanes[m] - (OUT)(last + 1)) & after);         \
            }                                                                                  \
        }                                                                                      \
        memcpy(ids, idv, sizeof idv);                                                          \
        memcpy(pos, posv, sizeof posv);                                                        \
        return (NAME##_state){(OUT)(idv[BLOCK / OUTS - 1][OUTS - 1] + (last == BLOCK - 1)),    \
                              (OUT)(BLOCK - 1 - last)};                                        \
    }                                                                                          \
    /* One window. Between blocks without a boundary the ids stay one broadcast vector and the \
       positions a vector that steps on by the block. */                                       \
    TARGET static int NAME(const TOKEN *in, Py_ssize_t seq, TOKEN boundary, TOKEN largest,     \
                           OUT *ids, OUT *pos) {                                               \
        enum { TOKENS = NAME##_TOKENS, OUTS = NAME##_OUTS };                                   \
        const TOKEN flip = (TOKEN)1 << (8 * sizeof(TOKEN) - 1);                                \
        const NAME##_signed limit = (NAME##_signed){0} + (SIGNED)(largest ^ flip);             \
        NAME##_signed overs = {0};                                                             \
        NAME##_outs lanes, same = (NAME##_outs){0} + 1, next;                                  \
        memcpy(&lanes, LANES(OUT), VB);                                                        \
        next = lanes;                                                                          \
        Py_ssize_t t = 0;                                                                      \
        for (; t + BLOCK <= seq; t += BLOCK) {                                                 \
            NAME##_tokens v, any = {0};                                                        \
            for (int k = 0; k < BLOCK; k += TOKENS) {                                          \
                memcpy(&v, in + t + k, VB);                                                    \
                any |= (NAME##_tokens)(v == boundary);                                         \
                overs |= (NAME##_signed)((NAME##_signed)(v ^ flip) > limit);                   \
            }                                                                                  \
            uint64_t words[VB / 8];                                                            \
            memcpy(words, &any, VB);                                                           \
            if (any_word(words, VB / 8)) {                                                     \
                NAME##_state s = NAME##_split(in + t, boundary, (NAME##_state){same[0], next[0]}, \
                                              ids + t, pos + t);                               \
                same = (NAME##_outs){0} + s.id;                                                \
                next = lanes + s.at;                                                           \
                continue;                                                                      \
            }                                                                                  \
            for (int k = 0; k < BLOCK; k += OUTS) {                                            \
                memcpy(ids + t + k, &same, VB);                                                \
                memcpy(pos + t + k, &next, VB);                                                \
                next += (OUT)OUTS;                                                             \
            }                                                                                  \
        }                                                                                      \
        uint64_t words[VB / 8];                                                                \
        memcpy(words, &overs, VB);                                                             \
        int over = any_word(words, VB / 8) != 0;                                               \
        OUT id = same[0], at = next[0];                                                        \
        for (; t < seq; t++) STEP(t);                                                          \
        return over;                                                                           \
    }
#else
/* Elsewhere (and with PSKD_SEGMENTS_BY_TOKEN defined, as a test builds it), token by token. */
#define WIDE
#define DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT, VB, TARGET)                                      \
    static int NAME(const TOKEN *in, Py_ssize_t seq, TOKEN boundary, TOKEN largest, OUT *ids,  \
                    OUT *pos) {                                                                \
        OUT id = 1, at = 0;                                                                    \
        int over = 0;                                                                          \
        for (Py_ssize_t t = 0; t < seq; t++) STEP(t);                                          \
        return over;                                                                           \
    }
#endif

/* All windows of a batch, each from id 1 and position 0; whether any token is above largest. */
#define DEFINE_BATCH(NAME, TOKEN, SIGNED, OUT, VB, TARGET)                                     \
    DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT, VB, TARGET)                                          \
    TARGET static int NAME##_all(const void *in, Py_ssize_t n, Py_ssize_t seq, unsigned long long b,  \
                          unsigned long long largest, void *ids, void *pos) {                  \
        int over = 0;                                                                          \
        for (Py_ssize_t w = 0; w < n; w++)                                                     \
            over |= NAME((const TOKEN *)in + w * seq, seq, (TOKEN)b, (TOKEN)largest,           \
                         (OUT *)ids + w * seq, (OUT *)pos + w * seq);                          \
        return over;                                                                           \
    }

/* Every pair of a corpus's token width and an output width, in vectors of each width. */
#define DEFINE_WIDTHS(NAME, TOKEN, SIGNED, OUT)                                                \
    DEFINE_BATCH(NAME##_16, TOKEN, SIGNED, OUT, 16, )                                          \
    DEFINE_BATCH(NAME##_32, TOKEN, SIGNED, OUT, 32, WIDE)
DEFINE_WIDTHS(u8_i16, uint8_t, int8_t, int16_t)
DEFINE_WIDTHS(u16_i16, uint16_t, int16_t, int16_t)
DEFINE_WIDTHS(u32_i16, uint32_t, int32_t, int16_t)
DEFINE_WIDTHS(u8_i32, uint8_t, int8_t, int32_t)
DEFINE_WIDTHS(u16_i32, uint16_t, int16_t, int32_t)
DEFINE_WIDTHS(u32_i32, uint32_t, int32_t, int32_t)

typedef int (*fill_fn)(const void *, Py_ssize_t, Py_ssize_t, unsigned long long, unsigned long long, void *,
                       void *);

/* [vectors of 32 bytes][output of 4 bytes][tokens of 4 bytes, 2 or 1]; NULL: not scanned here. */
static const fill_fn SCANS[2][2][3] = {
    {{u8_i16_16_all, u16_i16_16_all, u32_i16_16_all}, {u8_i32_16_all, u16_i32_16_all, u32_i32_16_all}},
    {{u8_i16_32_all, u16_i16_32_all, u32_i16_32_all}, {u8_i32_32_all, u16_i32_32_all, u32_i32_32_all}},
};

static fill_fn pick(Py_ssize_t token, Py_ssize_t out, int wide) {
    if ((out != 2 && out != 4) || (token != 1 && token != 2 && token != 4)) return NULL;
    return SCANS[wide][out == 4][token == 4 ? 2 : token - 1];
}

/* The width of the vectors the module scans in unless asked (VECTOR_BYTES): 32 bytes where the
   processor has AVX2, else 16; 0 where the scan goes token by token (both "widths" are then the
   same code). wide_ok: whether 32-byte vectors may be asked for (on x86 only with AVX2: their
   code uses its instructions; elsewhere the compiler makes them of narrower ones). */
static int vector_bytes, wide_ok;

static void choose_vectors(void) {
#if !defined(__GNUC__) || defined(PSKD_SEGMENTS_BY_TOKEN)
    vector_bytes = 0, wide_ok = 1;
#elif defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    wide_ok = __builtin_cpu_supports("avx2") != 0;
    vector_bytes = wide_ok ? 32 : 16;
#else
    vector_bytes = 16, wide_ok = 1;
#endif
}

/* The vectors' width asked for (-1: VECTOR_BYTES), or 0 and a ValueError for one not scanned here. */
static int checked_width(Py_ssize_t *width) {
    if (*width == -1) *width = vector_bytes;
    if (*width == 16 || (*width == 32 && wide_ok) || (*width == 0 && vector_bytes == 0)) return 1;
    PyErr_Format(PyExc_ValueError, "vectors of %zd bytes are not scanned here (VECTOR_BYTES: %d)", *width,
                 vector_bytes);
    return 0;
}

static PyObject *fill(PyObject *self, PyObject *args) {
    PyObject *inputs, *outputs, *bound_object;
    unsigned long long boundary;
    Py_ssize_t seq, width = -1;
    if (!PyArg_ParseTuple(args, "OKnOO!|n", &inputs, &boundary, &seq, &outputs, &PyLong_Type, &bound_object,
                          &width))
        return NULL;
    if (!checked_width(&width)) return NULL;
    /* (checked, where "K" would take -1 as 2**64 - 1) */
    unsigned long long bound = PyLong_AsUnsignedLongLong(bound_object);
    if (bound == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer in, out;
    if (PyObject_GetBuffer(inputs, &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(outputs, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = in.itemsize ? in.len / in.itemsize : 0;
    fill_fn run = pick(in.itemsize, out.itemsize, width == 32);
    if (run == NULL) {
        PyErr_Format(PyExc_TypeError, "tokens of %zd bytes into outputs of %zd bytes are not scanned here",
                     in.itemsize, out.itemsize);
    } else if (seq <= 0 || count % seq != 0 || out.len != 2 * count * out.itemsize) {
        PyErr_Format(PyExc_ValueError, "%zd tokens are not whole windows of %zd with twice as many outputs",
                     count, seq);
    } else if (boundary >> (8 * in.itemsize) != 0) {  /* (itemsize 1, 2 or 4: a shift below 64) */
        PyErr_Format(PyExc_ValueError, "boundary %llu does not fit tokens of %zd bytes", boundary, in.itemsize);
    } else {
        char *ids = out.buf, *positions = ids + count * out.itemsize;
        /* The largest token allowed: bound - 1, or the tokens' own largest when bound is beyond them. */
        unsigned long long most = ~0ULL >> (64 - 8 * in.itemsize), largest = bound - 1 < most ? bound - 1 : most;
        int over;
        Py_BEGIN_ALLOW_THREADS
        over = run(in.buf, count / seq, seq, boundary, largest, ids, positions);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(!over && (bound > 0 || count == 0));  /* (none is below 0; an empty batch has none) */
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return result;
}

/* The largest token of count tokens is above largest: one pass the compiler vectorises. */
#define DEFINE_ABOVE(NAME, TOKEN)                                                              \
    static int NAME(const void *in, Py_ssize_t count, unsigned long long largest) {            \
        const TOKEN *tokens = in;                                                              \
        TOKEN most = 0;                                                                        \
        for (Py_ssize_t t = 0; t < count; t++) most = tokens[t] > most ? tokens[t] : most;     \
        return most > largest;                                                                 \
    }
DEFINE_ABOVE(above_u8, uint8_t)
DEFINE_ABOVE(above_u16, uint16_t)
DEFINE_ABOVE(above_u32, uint32_t)
typedef int (*above_fn)(const void *, Py_ssize_t, unsigned long long);
#define AHEAD 2 /* (how many windows ahead the gather asks memory for the next bytes) */
#if defined(__GNUC__)
#define PREFETCH(address) __builtin_prefetch((address), 0, 3)
#else
#define PREFETCH(address) ((void)(address))
#endif

/* gather(input_view, target_view, records, inputs, targets, outputs, boundary, bound[, vector_bytes]) -> every
   token below bound. The windows of a mapped corpus (CorpusWindows) copied and checked in one
   pass a window: row w of inputs is record records[w] of input_view, row w of targets the same
   record of target_view (the views over the maps the corpus makes: records of T tokens a byte
   apart, the targets' one token on); then, while the row is in the cache, its tokens and its
   target's last one are checked against bound and (outputs not None) its segments are scanned
   into outputs as fill writes them. Copied by numpy instead, each view is read on its own and
   the checks and the scan are passes over the whole batch after it: the inputs, 128 KiB a batch
   of B = 64, T = 1024 u16 tokens, are out of the nearest caches again by then. A record outside
   its view is an IndexError, before anything is copied. */
static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *views[2], *records_object, *inputs_object, *targets_object, *outputs_object, *bound_object;
    unsigned long long boundary;
    Py_ssize_t width = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOKO!|n", &views[0], &views[1], &records_object, &inputs_object,
                          &targets_object, &outputs_object, &boundary, &PyLong_Type, &bound_object, &width))
        return NULL;
    if (!checked_width(&width)) return NULL;
    unsigned long long bound = PyLong_AsUnsignedLongLong(bound_object);
    if (bound == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view[2], records, rows[2], out;
    int held = 0, segmenting = outputs_object != Py_None;
    PyObject *result = NULL;
    for (int k = 0; k < 2; k++, held++)
        if (PyObject_GetBuffer(views[k], &view[k], PyBUF_RECORDS_RO) < 0) goto done;
    if (PyObject_GetBuffer(records_object, &records, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    held++;
    if (PyObject_GetBuffer(inputs_object, &rows[0], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) goto done;
    held++;
    if (PyObject_GetBuffer(targets_object, &rows[1], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) goto done;
    held++;
    if (segmenting &&
        PyObject_GetBuffer(outputs_object, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        goto done;
    held += segmenting;
    Py_ssize_t item = rows[0].itemsize, n = records.itemsize == 8 ? records.len / 8 : -1;
    Py_ssize_t row_bytes = view[0].itemsize, seq = item ? row_bytes / item : 0;
    if (n < 0 || (strcmp(records.format, "l") != 0 && strcmp(records.format, "q") != 0)) {
        PyErr_SetString(PyExc_TypeError, "records are int64");
        goto done;
    }
    if (item != 1 && item != 2 && item != 4) {
        PyErr_Format(PyExc_TypeError, "tokens of %zd bytes are not gathered here", item);
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        if (view[k].ndim != 1 || (view[k].shape[0] > 1 && view[k].strides[0] != 1) || view[k].itemsize != row_bytes ||
            rows[k].itemsize != item || rows[k].len != n * row_bytes || seq * item != row_bytes || seq == 0) {
            PyErr_Format(PyExc_ValueError, "views of records of %zd bytes a byte apart, and %zd rows of %zd tokens "
                         "of %zd bytes, are what is gathered", row_bytes, n, seq, item);
            goto done;
        }
    }
    if (boundary >> (8 * item) != 0) {
        PyErr_Format(PyExc_ValueError, "boundary %llu does not fit tokens of %zd bytes", boundary, item);
        goto done;
    }
    fill_fn scan = NULL;
    char *ids = NULL, *positions = NULL;
    if (segmenting) {
        scan = pick(item, out.itemsize, width == 32);
        if (scan == NULL || out.len != 2 * n * seq * out.itemsize) {
            PyErr_Format(PyExc_ValueError, "outputs of %zd bytes are not twice the rows' tokens of 2 or 4 bytes",
                         out.len);
            goto done;
        }
        ids = out.buf, positions = ids + n * seq * out.itemsize;
    }
    const int64_t *at = records.buf;
    for (Py_ssize_t w = 0; w < n; w++) {
        if (at[w] < 0 || at[w] >= view[0].shape[0] || at[w] >= view[1].shape[0]) {
            PyErr_Format(PyExc_IndexError, "record %lld of row %zd is outside the views' %zd records",
                         (long long)at[w], w, view[0].shape[0]);
            goto done;
        }
    }
    unsigned long long most = ~0ULL >> (64 - 8 * item), largest = bound - 1 < most ? bound - 1 : most;
    above_fn above = item == 1 ? above_u8 : item == 2 ? above_u16 : above_u32;
    int over = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t w = 0; w < n; w++) {
        char *in = (char *)rows[0].buf + w * row_bytes, *target = (char *)rows[1].buf + w * row_bytes;
        if (w + AHEAD < n) { /* (the window after next asked of memory while this one is copied) */
            const char *next = (const char *)view[1].buf + at[w + AHEAD];
            for (Py_ssize_t b = 0; b < row_bytes; b += 64) PREFETCH(next + b);
        }
        memcpy(in, (const char *)view[0].buf + at[w], row_bytes);
        memcpy(target, (const char *)view[1].buf + at[w], row_bytes);
        over |= above(target + row_bytes - item, 1, largest);
        if (segmenting)
            over |= scan(in, 1, seq, boundary, largest, ids + w * seq * out.itemsize,
                         positions + w * seq * out.itemsize);
        else if (bound <= most)
            over |= above(in, seq, largest);
    }
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(!over && (bound > 0 || n == 0));
done:
    if (held > 5) PyBuffer_Release(&out);
    if (held > 4) PyBuffer_Release(&rows[1]);
    if (held > 3) PyBuffer_Release(&rows[0]);
    if (held > 2) PyBuffer_Release(&records);
    if (held > 1) PyBuffer_Release(&view[1]);
    if (held > 0) PyBuffer_Release(&view[0]);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS,
     "fill(inputs, boundary, seq, outputs, bound[, vector_bytes]) -> every token below bound: each token's "
     "segment id, then each one's position, into outputs; in vectors of VECTOR_BYTES unless asked (16 or 32)."},
    {"gather", gather, METH_VARARGS,
     "gather(input_view, target_view, records, inputs, targets, outputs, boundary, bound[, vector_bytes]) -> every "
     "token below "
     "bound: a mapped corpus's windows copied, checked and (outputs not None) their segments scanned, a window "
     "at a time."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pskd_jax.corpus._segments",
    "Packed segments of a batch of windows in one pass (see pskd_jax.corpus.segments).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__segments(void) {
    choose_vectors();
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && PyModule_AddIntConstant(made, "VECTOR_BYTES", vector_bytes) < 0) {
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
