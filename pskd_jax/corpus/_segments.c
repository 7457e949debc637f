/* Packed segments of a batch of windows: pskd_jax.corpus.segments, compiled.

   fill(inputs, boundary, seq, outputs, bound) writes each input token's segment id, then each
   one's position (the rules in segments.py), into the output buffer: its first half the ids,
   its second the positions. It returns whether every input token is below bound: a corpus's
   gather checks its tokens against the vocabulary size, and the check rides in the scan's read
   of the tokens (one compare a vector more) instead of a pass of its own over the batch. The
   inputs are C-contiguous unsigned tokens of 1, 2 or 4 bytes, a whole number of windows of seq
   tokens; the outputs C-contiguous signed integers of 2 or 4 bytes, twice as many. The caller
   (segments.py) chooses the types; this module checks what keeps it inside the buffers.

   Why compiled: numpy needs several passes and a dozen calls for what is one read of the tokens
   and one write of each output, and a Loader gathers batches of 64 Ki tokens in well under a
   hundred microseconds. The scan reads the tokens a block of 32 at a time (see DEFINE_SCAN);
   only the last few tokens of a window that is not whole blocks go one by one. The GIL is let
   go during the scan, so a Loader's thread overlaps it with the training step. */

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
/* With GCC's vector types (gcc, clang), in vectors of 16 bytes, the width every x86-64 and arm64
   processor has. A window is scanned a chunk at a time, in three passes over the chunk, each
   touching one output: first the tokens are read, a block of 32 at a time, for the boundaries
   (their indices noted; a block's compares are ORed together, and only a block holding one, rare
   since documents are hundreds of tokens long, is looked into) and for a token above the largest
   allowed; then the ids are written, a run of one value a segment; then the positions, a run
   counting from 0 a segment. Why passes: stores that alternate between the two outputs ran at
   half the speed of the same stores one output after the other (measured: the cores' stores to
   one line after another coalesce, to two lines by turns do not), and the stores are what the
   scan costs. A token above the largest is found by a signed compare of both with their top bits
   flipped (SSE2 has no unsigned compare: two instructions, where the compiler's unsigned compare
   takes three), ORed across the chunk. */
#define BLOCK 32
#define VB 16
#define CHUNK 4096 /* tokens of a window scanned before its outputs are written (their cuts fit on the stack) */
static const int16_t LANES16[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static const int32_t LANES32[4] = {0, 1, 2, 3};
#define LANES(OUT) (sizeof(OUT) == 2 ? (const void *)LANES16 : (const void *)LANES32)

#define DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT)                                                  \
    typedef TOKEN NAME##_tokens __attribute__((vector_size(VB)));                              \
    typedef SIGNED NAME##_signed __attribute__((vector_size(VB)));                             \
    typedef OUT NAME##_outs __attribute__((vector_size(VB)));                                  \
    enum { NAME##_TOKENS = VB / sizeof(TOKEN), NAME##_OUTS = VB / sizeof(OUT) };               \
    /* The boundaries of a block holding one, appended to cuts (rare: kept out of the loop). */ \
    __attribute__((noinline)) static Py_ssize_t NAME##_block_cuts(const TOKEN *in, TOKEN boundary, \
                                                                  int32_t at, int32_t *cuts, Py_ssize_t count) { \
        enum { TOKENS = NAME##_TOKENS, BITS = 8 * sizeof(TOKEN) };                             \
        for (int k = 0; k < BLOCK; k += TOKENS) {                                              \
            NAME##_tokens v;                                                                   \
            uint64_t bits[VB / 8];                                                             \
            memcpy(&v, in + k, VB);                                                            \
            v = (NAME##_tokens)(v == boundary);                                                \
            memcpy(bits, &v, VB);                                                              \
            for (int w = 0; w < VB / 8; w++)                                                   \
                for (uint64_t word = bits[w]; word; ) { /* (a boundary's lane: all ones) */    \
                    int bit = __builtin_ctzll(word);                                           \
                    cuts[count++] = at + k + w * (64 / BITS) + bit / BITS;                     \
                    word &= ~((~0ULL >> (64 - BITS)) << bit);                                  \
                }                                                                              \
        }                                                                                      \
        return count;                                                                          \
    }                                                                                          \
    /* The indices of the boundaries among in[0, len) into cuts (their count returned); *over  \
       set when a token is above largest. */                                                   \
    static Py_ssize_t NAME##_cuts(const TOKEN *in, Py_ssize_t len, TOKEN boundary, TOKEN largest, \
                                  int32_t *cuts, int *over) {                                   \
        const TOKEN flip = (TOKEN)1 << (8 * sizeof(TOKEN) - 1);                                \
        const NAME##_signed limit = (NAME##_signed){0} + (SIGNED)(largest ^ flip);             \
        NAME##_signed overs = {0};                                                             \
        Py_ssize_t count = 0, t = 0;                                                           \
        for (; t + BLOCK <= len; t += BLOCK) {                                                 \
            NAME##_tokens v, any = {0};                                                        \
            for (int k = 0; k < BLOCK; k += NAME##_TOKENS) {                                   \
                memcpy(&v, in + t + k, VB);                                                    \
                any |= (NAME##_tokens)(v == boundary);                                         \
                overs |= (NAME##_signed)((NAME##_signed)(v ^ flip) > limit);                   \
            }                                                                                  \
            uint64_t words[VB / 8];                                                            \
            memcpy(words, &any, VB);                                                           \
            if (words[0] | words[1]) count = NAME##_block_cuts(in + t, boundary, (int32_t)t, cuts, count); \
        }                                                                                      \
        uint64_t words[VB / 8];                                                                \
        memcpy(words, &overs, VB);                                                             \
        int above = (words[0] | words[1]) != 0;                                                \
        for (; t < len; t++) {                                                                 \
            if (in[t] == boundary) cuts[count++] = (int32_t)t;                                 \
            above |= in[t] > largest;                                                          \
        }                                                                                      \
        *over |= above;                                                                        \
        return count;                                                                          \
    }                                                                                          \
    /* out[0, len) = value, value + step, value + 2 step, … (step 0: one value; 1: a count). */ \
    static inline void NAME##_run(OUT *out, Py_ssize_t len, OUT value, OUT step) {             \
        enum { OUTS = NAME##_OUTS };                                                           \
        if (len < OUTS) {                                                                      \
            for (Py_ssize_t i = 0; i < len; i++) out[i] = (OUT)(value + i * step);             \
            return;                                                                            \
        }                                                                                      \
        NAME##_outs lanes, v;                                                                  \
        memcpy(&lanes, LANES(OUT), VB);                                                        \
        lanes *= step;                                                                         \
        v = lanes + value;                                                                     \
        Py_ssize_t i = 0;                                                                      \
        for (; i + OUTS <= len; i += OUTS) {                                                   \
            memcpy(out + i, &v, VB);                                                           \
            v += (OUT)(OUTS * step);                                                           \
        }                                                                                      \
        if (i < len) { /* the last few: one store ending at len, over some written already */  \
            v = lanes + (OUT)(value + (len - OUTS) * step);                                    \
            memcpy(out + len - OUTS, &v, VB);                                                  \
        }                                                                                      \
    }                                                                                          \
    /* One window, a chunk at a time: its boundaries, then its ids, then its positions. */     \
    static int NAME(const TOKEN *in, Py_ssize_t seq, TOKEN boundary, TOKEN largest, OUT *ids,  \
                    OUT *pos) {                                                                \
        int32_t cuts[CHUNK];                                                                   \
        int over = 0;                                                                          \
        OUT id = 1, at = 0;                                                                    \
        for (Py_ssize_t c = 0; c < seq; c += CHUNK) {                                          \
            Py_ssize_t len = seq - c < CHUNK ? seq - c : CHUNK;                                \
            Py_ssize_t count = NAME##_cuts(in + c, len, boundary, largest, cuts, &over);       \
            Py_ssize_t a = 0;                                                                  \
            OUT next = id;                                                                     \
            for (Py_ssize_t k = 0; k < count; k++, next++) { /* a boundary ends its segment */ \
                NAME##_run(ids + c + a, cuts[k] + 1 - a, next, 0);                             \
                a = cuts[k] + 1;                                                               \
            }                                                                                  \
            NAME##_run(ids + c + a, len - a, next, 0);                                         \
            a = 0;                                                                             \
            for (Py_ssize_t k = 0; k < count; k++) {                                           \
                NAME##_run(pos + c + a, cuts[k] + 1 - a, a ? 0 : at, 1);                       \
                a = cuts[k] + 1;                                                               \
            }                                                                                  \
            NAME##_run(pos + c + a, len - a, a || count ? 0 : at, 1);                          \
            at = (OUT)((count ? 0 : at) + len - a);                                            \
            id = next;                                                                         \
        }                                                                                      \
        return over;                                                                           \
    }
#else
/* Elsewhere (and with PSKD_SEGMENTS_BY_TOKEN defined, as a test builds it), token by token. */
#define DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT)                                                  \
    static int NAME(const TOKEN *in, Py_ssize_t seq, TOKEN boundary, TOKEN largest, OUT *ids,  \
                    OUT *pos) {                                                                \
        OUT id = 1, at = 0;                                                                    \
        int over = 0;                                                                          \
        for (Py_ssize_t t = 0; t < seq; t++) STEP(t);                                          \
        return over;                                                                           \
    }
#endif

/* All windows of a batch, each from id 1 and position 0; whether any token is above largest. */
#define DEFINE_BATCH(NAME, TOKEN, SIGNED, OUT)                                                 \
    DEFINE_SCAN(NAME, TOKEN, SIGNED, OUT)                                                      \
    static int NAME##_all(const void *in, Py_ssize_t n, Py_ssize_t seq, unsigned long long b,  \
                          unsigned long long largest, void *ids, void *pos) {                  \
        int over = 0;                                                                          \
        for (Py_ssize_t w = 0; w < n; w++)                                                     \
            over |= NAME((const TOKEN *)in + w * seq, seq, (TOKEN)b, (TOKEN)largest,           \
                         (OUT *)ids + w * seq, (OUT *)pos + w * seq);                          \
        return over;                                                                           \
    }

/* Every pair of a corpus's token width and an output width. */
DEFINE_BATCH(u8_i16, uint8_t, int8_t, int16_t)
DEFINE_BATCH(u16_i16, uint16_t, int16_t, int16_t)
DEFINE_BATCH(u32_i16, uint32_t, int32_t, int16_t)
DEFINE_BATCH(u8_i32, uint8_t, int8_t, int32_t)
DEFINE_BATCH(u16_i32, uint16_t, int16_t, int32_t)
DEFINE_BATCH(u32_i32, uint32_t, int32_t, int32_t)

typedef int (*fill_fn)(const void *, Py_ssize_t, Py_ssize_t, unsigned long long, unsigned long long, void *,
                       void *);

static fill_fn pick(Py_ssize_t token, Py_ssize_t out) {
    if (out == 2) return token == 1 ? u8_i16_all : token == 2 ? u16_i16_all : token == 4 ? u32_i16_all : NULL;
    if (out == 4) return token == 1 ? u8_i32_all : token == 2 ? u16_i32_all : token == 4 ? u32_i32_all : NULL;
    return NULL;
}

static PyObject *fill(PyObject *self, PyObject *args) {
    PyObject *inputs, *outputs, *bound_object;
    unsigned long long boundary;
    Py_ssize_t seq;
    if (!PyArg_ParseTuple(args, "OKnOO!", &inputs, &boundary, &seq, &outputs, &PyLong_Type, &bound_object))
        return NULL;
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
    fill_fn run = pick(in.itemsize, out.itemsize);
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

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS,
     "fill(inputs, boundary, seq, outputs, bound) -> every token below bound: each token's segment id, then "
     "each one's position, into outputs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pskd_jax.corpus._segments",
    "Packed segments of a batch of windows in one pass (see pskd_jax.corpus.segments).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__segments(void) { return PyModule_Create(&module); }
