/*
 * statebackend._native: the compiled twins of statebackend/keys/kernels.py.
 *
 * Two kernels over whole columns of grouping keys (column specs are plain tuples built by
 * statebackend/keys/groups.py; see the docstring of statebackend/keys/kernels.py):
 *
 *   hash_columns(columns, out, max_parallelism) -> None
 *       Spark's Murmur3_x86_32 (seed chained column to column, nulls skipped), then
 *       optionally pmod(hash, max_parallelism), written in place into the int32 `out`.
 *   encode_keys(columns, key_groups) -> list[bytes]
 *       2-byte big-endian key group, then one field per column.
 *
 * split_fixed(buffer, width) -> list[bytes] cuts whole-column encoded rows apart,
 * and four over value blocks (many keys' values in one RocksDB entry):
 *
 *   block_ids(keys, out, nbuckets), unpack_block(bytes) -> dict,
 *   blocks_get(blocks, slots, keys) -> list, blocks_put(blocks, slots, keys, values) -> list
 *
 * Each must stay byte-for-byte equal to its pure-Python twin; tests/test_native.py checks.
 * C99, CPython API only, no numpy headers: arrays arrive through the buffer protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- Murmur3_x86_32 exactly as Spark's Murmur3_x86_32.java ----------------------- */

static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t mix_k1(uint32_t k1) {
    k1 *= 0xcc9e2d51u;
    k1 = rotl32(k1, 15);
    return k1 * 0x1b873593u;
}

static inline uint32_t mix_h1(uint32_t h1, uint32_t k1) {
    h1 ^= k1;
    h1 = rotl32(h1, 13);
    return h1 * 5u + 0xe6546b64u;
}

static inline uint32_t fmix(uint32_t h1, uint32_t length) {
    h1 ^= length;
    h1 ^= h1 >> 16;
    h1 *= 0x85ebca6bu;
    h1 ^= h1 >> 13;
    h1 *= 0xc2b2ae35u;
    h1 ^= h1 >> 16;
    return h1;
}

static inline uint32_t hash_int(uint32_t v, uint32_t seed) {
    return fmix(mix_h1(seed, mix_k1(v)), 4);
}

static inline uint32_t hash_long(uint64_t v, uint32_t seed) {
    uint32_t h1 = mix_h1(seed, mix_k1((uint32_t)v));
    h1 = mix_h1(h1, mix_k1((uint32_t)(v >> 32)));
    return fmix(h1, 8);
}

/* Spark's legacy hashUnsafeBytes: little-endian words, then each tail byte mixed as a
 * sign-extended int (not the reference Murmur3 tail). */
static inline uint32_t hash_bytes(const uint8_t *p, Py_ssize_t n, uint32_t seed) {
    Py_ssize_t aligned = n - n % 4;
    uint32_t h1 = seed;
    for (Py_ssize_t i = 0; i < aligned; i += 4) {
        uint32_t w = (uint32_t)p[i] | ((uint32_t)p[i + 1] << 8) | ((uint32_t)p[i + 2] << 16) |
                     ((uint32_t)p[i + 3] << 24);
        h1 = mix_h1(h1, mix_k1(w));
    }
    for (Py_ssize_t i = aligned; i < n; i++) {
        int32_t b = (int8_t)p[i];
        h1 = mix_h1(h1, mix_k1((uint32_t)b));
    }
    return fmix(h1, (uint32_t)n);
}

/* ---- column specs ----------------------------------------------------------------- */

enum kind { K_I32, K_I64, K_INT, K_F32, K_F64, K_OBJ, K_A32, K_A64 };

typedef struct {
    enum kind kind;
    Py_buffer values; /* numeric values, or Arrow data */
    Py_buffer offsets; /* Arrow offsets */
    Py_buffer mask;
    int has_values, has_offsets, has_mask;
    PyObject *seq; /* PySequence_Fast of an "obj" column (owned) */
} column_t;

static void column_release(column_t *c) {
    if (c->has_values) PyBuffer_Release(&c->values);
    if (c->has_offsets) PyBuffer_Release(&c->offsets);
    if (c->has_mask) PyBuffer_Release(&c->mask);
    Py_XDECREF(c->seq);
    c->has_values = c->has_offsets = c->has_mask = 0;
    c->seq = NULL;
}

static void columns_release(column_t *cols, Py_ssize_t ncols) {
    if (cols == NULL) return;
    for (Py_ssize_t i = 0; i < ncols; i++) column_release(&cols[i]);
    PyMem_Free(cols);
}

static int get_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n,
                     const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes, got %zd", what, itemsize,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (n >= 0 && view->len / itemsize != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows, expected %zd", what,
                     view->len / itemsize, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Parse one column spec tuple for n rows. `encode` selects which numeric kinds are legal. */
static int column_parse(PyObject *spec, Py_ssize_t n, int encode, column_t *c) {
    memset(c, 0, sizeof(*c));
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2) {
        PyErr_SetString(PyExc_TypeError, "a column spec is a tuple (kind, ...)");
        return -1;
    }
    const char *k = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    if (k == NULL) return -1;
    Py_ssize_t size = PyTuple_GET_SIZE(spec);
    if (strcmp(k, "obj") == 0) {
        c->kind = K_OBJ;
        c->seq = PySequence_Fast(PyTuple_GET_ITEM(spec, 1), "obj column must be a sequence");
        if (c->seq == NULL) return -1;
        if (PySequence_Fast_GET_SIZE(c->seq) != n) {
            PyErr_Format(PyExc_ValueError, "column 'obj' has %zd rows, expected %zd",
                         PySequence_Fast_GET_SIZE(c->seq), n);
            goto fail;
        }
        return 0;
    }
    if (strcmp(k, "a32") == 0 || strcmp(k, "a64") == 0) {
        c->kind = k[1] == '3' ? K_A32 : K_A64;
        if (size != 4) {
            PyErr_SetString(PyExc_TypeError, "an Arrow column spec is (kind, offsets, data, mask)");
            return -1;
        }
        if (get_array(PyTuple_GET_ITEM(spec, 1), &c->offsets, c->kind == K_A32 ? 4 : 8, n + 1,
                      "offsets") < 0)
            return -1;
        c->has_offsets = 1;
        if (get_array(PyTuple_GET_ITEM(spec, 2), &c->values, 1, -1, "data") < 0) goto fail;
        c->has_values = 1;
        /* Every offset must lie in the data buffer and never decrease: bad input must
         * raise, not read out of bounds. */
        Py_ssize_t dlen = c->values.len;
        if (c->kind == K_A32) {
            const int32_t *o = (const int32_t *)c->offsets.buf;
            for (Py_ssize_t i = 0; i < n; i++)
                if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > dlen) goto bad_offsets;
            if (n == 0 && (o[0] < 0 || o[0] > dlen)) goto bad_offsets;
        } else {
            const int64_t *o = (const int64_t *)c->offsets.buf;
            for (Py_ssize_t i = 0; i < n; i++)
                if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > dlen) goto bad_offsets;
            if (n == 0 && (o[0] < 0 || o[0] > dlen)) goto bad_offsets;
        }
        if (PyTuple_GET_ITEM(spec, 3) != Py_None) {
            if (get_array(PyTuple_GET_ITEM(spec, 3), &c->mask, 1, n, "mask") < 0) goto fail;
            c->has_mask = 1;
        }
        return 0;
    bad_offsets:
        PyErr_SetString(PyExc_ValueError, "Arrow offsets out of bounds or decreasing");
        goto fail;
    }
    Py_ssize_t itemsize;
    if (!encode && strcmp(k, "i32") == 0) {
        c->kind = K_I32;
        itemsize = 4;
    } else if (!encode && strcmp(k, "i64") == 0) {
        c->kind = K_I64;
        itemsize = 8;
    } else if (encode && strcmp(k, "int") == 0) {
        c->kind = K_INT;
        itemsize = 8;
    } else if (encode && strcmp(k, "f32") == 0) {
        c->kind = K_F32;
        itemsize = 4;
    } else if (encode && strcmp(k, "f64") == 0) {
        c->kind = K_F64;
        itemsize = 8;
    } else {
        PyErr_Format(PyExc_ValueError, "unknown column kind '%s' for %s", k,
                     encode ? "encoding" : "hashing");
        return -1;
    }
    if (size != 3) {
        PyErr_SetString(PyExc_TypeError, "a numeric column spec is (kind, values, mask)");
        return -1;
    }
    if (get_array(PyTuple_GET_ITEM(spec, 1), &c->values, itemsize, n, k) < 0) return -1;
    c->has_values = 1;
    if (PyTuple_GET_ITEM(spec, 2) != Py_None) {
        if (get_array(PyTuple_GET_ITEM(spec, 2), &c->mask, 1, n, "mask") < 0) goto fail;
        c->has_mask = 1;
    }
    return 0;
fail:
    column_release(c);
    return -1;
}

static column_t *columns_parse(PyObject *columns, Py_ssize_t n, int encode, Py_ssize_t *ncols) {
    PyObject *seq = PySequence_Fast(columns, "columns must be a sequence of column specs");
    if (seq == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    column_t *cols = PyMem_Calloc(m > 0 ? (size_t)m : 1, sizeof(column_t));
    if (cols == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (column_parse(PySequence_Fast_GET_ITEM(seq, i), n, encode, &cols[i]) < 0) {
            columns_release(cols, i);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    *ncols = m;
    return cols;
}

/* The bytes of an "obj" item: 1 = present, 0 = null (None, NaN, pd.NA), -1 = error. A str's
 * UTF-8 form is cached by CPython (free for ASCII strings); lone surrogates raise
 * UnicodeEncodeError like str.encode("utf-8") in the twin. */
static inline int obj_bytes(PyObject *o, const char **p, Py_ssize_t *n) {
    if (PyUnicode_CheckExact(o) || PyUnicode_Check(o)) {
        *p = PyUnicode_AsUTF8AndSize(o, n);
        return *p != NULL ? 1 : -1;
    }
    if (o == Py_None) return 0;
    if (PyBytes_Check(o)) {
        *p = PyBytes_AS_STRING(o);
        *n = PyBytes_GET_SIZE(o);
        return 1;
    }
    if (PyByteArray_Check(o)) {
        *p = PyByteArray_AS_STRING(o);
        *n = PyByteArray_GET_SIZE(o);
        return 1;
    }
    if (PyFloat_Check(o) && isnan(PyFloat_AS_DOUBLE(o))) return 0;
    /* pandas' missing-value singleton, without importing pandas. */
    if (strcmp(Py_TYPE(o)->tp_name, "NAType") == 0) return 0;
    PyErr_Format(PyExc_TypeError,
                 "expected str, bytes or None in a string/binary key column, got %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
}

static inline int mask_at(const column_t *c, Py_ssize_t i) {
    return !c->has_mask || ((const uint8_t *)c->mask.buf)[i] != 0;
}

static inline void arrow_item(const column_t *c, Py_ssize_t i, const uint8_t **p, Py_ssize_t *n) {
    int64_t a, b;
    if (c->kind == K_A32) {
        a = ((const int32_t *)c->offsets.buf)[i];
        b = ((const int32_t *)c->offsets.buf)[i + 1];
    } else {
        a = ((const int64_t *)c->offsets.buf)[i];
        b = ((const int64_t *)c->offsets.buf)[i + 1];
    }
    *p = (const uint8_t *)c->values.buf + a;
    *n = (Py_ssize_t)(b - a);
}

/* ---- hash_columns ------------------------------------------------------------------ */

static PyObject *py_hash_columns(PyObject *self, PyObject *args) {
    PyObject *columns, *out_obj;
    long max_parallelism;
    if (!PyArg_ParseTuple(args, "OOl:hash_columns", &columns, &out_obj, &max_parallelism))
        return NULL;
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    if (out.itemsize != 4) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_TypeError, "out must be a writable, C-contiguous int32 array");
        return NULL;
    }
    Py_ssize_t n = out.len / 4, ncols = 0;
    column_t *cols = columns_parse(columns, n, 0, &ncols);
    if (cols == NULL) {
        PyBuffer_Release(&out);
        return NULL;
    }
    uint32_t *h = (uint32_t *)out.buf;
    int ok = 1;
    for (Py_ssize_t j = 0; j < ncols && ok; j++) {
        const column_t *c = &cols[j];
        if (c->kind == K_OBJ) {
            PyObject **items = PySequence_Fast_ITEMS(c->seq);
            for (Py_ssize_t i = 0; i < n; i++) {
                const char *p = NULL;
                Py_ssize_t len = 0;
                int r = obj_bytes(items[i], &p, &len);
                if (r < 0) {
                    ok = 0;
                    break;
                }
                if (r) h[i] = hash_bytes((const uint8_t *)p, len, h[i]);
            }
            continue;
        }
        /* Numeric and Arrow columns touch no Python objects: let other threads run. */
        Py_BEGIN_ALLOW_THREADS
        if (c->kind == K_I32) {
            const uint32_t *v = (const uint32_t *)c->values.buf;
            if (c->has_mask) {
                const uint8_t *m = (const uint8_t *)c->mask.buf;
                for (Py_ssize_t i = 0; i < n; i++)
                    if (m[i]) h[i] = hash_int(v[i], h[i]);
            } else {
                for (Py_ssize_t i = 0; i < n; i++) h[i] = hash_int(v[i], h[i]);
            }
        } else if (c->kind == K_I64) {
            const uint64_t *v = (const uint64_t *)c->values.buf;
            if (c->has_mask) {
                const uint8_t *m = (const uint8_t *)c->mask.buf;
                for (Py_ssize_t i = 0; i < n; i++)
                    if (m[i]) h[i] = hash_long(v[i], h[i]);
            } else {
                for (Py_ssize_t i = 0; i < n; i++) h[i] = hash_long(v[i], h[i]);
            }
        } else { /* Arrow */
            for (Py_ssize_t i = 0; i < n; i++) {
                if (!mask_at(c, i)) continue;
                const uint8_t *p;
                Py_ssize_t len = 0;
                arrow_item(c, i, &p, &len);
                h[i] = hash_bytes(p, len, h[i]);
            }
        }
        Py_END_ALLOW_THREADS
    }
    if (ok && max_parallelism > 0) {
        int32_t *s = (int32_t *)out.buf;
        int32_t mp = (int32_t)max_parallelism;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t r = s[i] % mp;
            s[i] = r < 0 ? r + mp : r;
        }
    }
    columns_release(cols, ncols);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- encode_keys ------------------------------------------------------------------- */

static inline Py_ssize_t varint_len(uint64_t v) {
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint64_t zigzag(int64_t v) {
    return ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0);
}

/* The int field is varint(zigzag(v) + 1); zigzag(INT64_MIN) + 1 is 2**64, which needs
 * the 65th bit: nine continuation bytes then 0x02. */
static inline Py_ssize_t int_field_len(int64_t v) {
    uint64_t z = zigzag(v);
    return z == UINT64_MAX ? 10 : varint_len(z + 1);
}

static inline uint8_t *put_int_field(uint8_t *p, int64_t v) {
    uint64_t z = zigzag(v);
    if (z == UINT64_MAX) {
        memset(p, 0x80, 9);
        p[9] = 0x02;
        return p + 10;
    }
    return put_varint(p, z + 1);
}

typedef struct {
    const uint8_t *p;
    Py_ssize_t n; /* -1 = null */
} span_t;

static PyObject *py_encode_keys(PyObject *self, PyObject *args) {
    PyObject *columns, *kg_obj;
    if (!PyArg_ParseTuple(args, "OO:encode_keys", &columns, &kg_obj)) return NULL;
    Py_buffer kgv;
    if (PyObject_GetBuffer(kg_obj, &kgv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    const char *fmt = kgv.format ? kgv.format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '>' || *fmt == '!') fmt++;
    if (kgv.itemsize != 4 || (*fmt != 'i' && *fmt != 'l')) {
        PyBuffer_Release(&kgv);
        PyErr_SetString(PyExc_TypeError, "key_groups must be an int32 array");
        return NULL;
    }
    const int32_t *kgs = (const int32_t *)kgv.buf;
    Py_ssize_t n = kgv.len / 4, ncols = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kgs[i] < 0 || kgs[i] > 0xffff) {
            PyBuffer_Release(&kgv);
            PyErr_SetString(PyExc_OverflowError, "a key group does not fit in 2 bytes");
            return NULL;
        }
    }
    column_t *cols = columns_parse(columns, n, 1, &ncols);
    if (cols == NULL) {
        PyBuffer_Release(&kgv);
        return NULL;
    }
    span_t *spans = PyMem_Calloc(ncols > 0 ? (size_t)ncols : 1, sizeof(span_t));
    PyObject *result = spans ? PyList_New(n) : PyErr_NoMemory();
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* First pass over the row's columns: size (and remember byte spans). */
        Py_ssize_t size = 2;
        for (Py_ssize_t j = 0; j < ncols; j++) {
            const column_t *c = &cols[j];
            switch (c->kind) {
            case K_INT:
                size += mask_at(c, i) ? int_field_len(((const int64_t *)c->values.buf)[i]) : 1;
                break;
            case K_F32:
                size += mask_at(c, i) ? 5 : 1;
                break;
            case K_F64:
                size += mask_at(c, i) ? 9 : 1;
                break;
            case K_OBJ: {
                const char *p = NULL;
                Py_ssize_t len = 0;
                int r = obj_bytes(PySequence_Fast_ITEMS(c->seq)[i], &p, &len);
                if (r < 0) goto error;
                spans[j].p = (const uint8_t *)p;
                spans[j].n = r ? len : -1;
                size += r ? varint_len((uint64_t)len + 1) + len : 1;
                break;
            }
            default: /* Arrow */
                if (mask_at(c, i)) {
                    arrow_item(c, i, &spans[j].p, &spans[j].n);
                    size += varint_len((uint64_t)spans[j].n + 1) + spans[j].n;
                } else {
                    spans[j].n = -1;
                    size += 1;
                }
            }
        }
        PyObject *b = PyBytes_FromStringAndSize(NULL, size);
        if (b == NULL) goto error;
        uint8_t *q = (uint8_t *)PyBytes_AS_STRING(b);
        *q++ = (uint8_t)(kgs[i] >> 8);
        *q++ = (uint8_t)kgs[i];
        for (Py_ssize_t j = 0; j < ncols; j++) {
            const column_t *c = &cols[j];
            switch (c->kind) {
            case K_INT:
                if (mask_at(c, i))
                    q = put_int_field(q, ((const int64_t *)c->values.buf)[i]);
                else
                    *q++ = 0;
                break;
            case K_F32:
                if (mask_at(c, i)) {
                    uint32_t v = ((const uint32_t *)c->values.buf)[i];
                    *q++ = 1;
                    for (int s = 24; s >= 0; s -= 8) *q++ = (uint8_t)(v >> s);
                } else {
                    *q++ = 0;
                }
                break;
            case K_F64:
                if (mask_at(c, i)) {
                    uint64_t v = ((const uint64_t *)c->values.buf)[i];
                    *q++ = 1;
                    for (int s = 56; s >= 0; s -= 8) *q++ = (uint8_t)(v >> s);
                } else {
                    *q++ = 0;
                }
                break;
            default: /* obj and Arrow: spans from the first pass */
                if (spans[j].n < 0) {
                    *q++ = 0;
                } else {
                    q = put_varint(q, (uint64_t)spans[j].n + 1);
                    memcpy(q, spans[j].p, (size_t)spans[j].n);
                    q += spans[j].n;
                }
            }
        }
        PyList_SET_ITEM(result, i, b);
    }
    goto done;
error:
    Py_CLEAR(result);
done:
    PyMem_Free(spans);
    columns_release(cols, ncols);
    PyBuffer_Release(&kgv);
    return result;
}

/* ---- module ------------------------------------------------------------------------ */


/* ---- value blocks (KeyedColumnState's block layout) ---------------------------------
 *
 * block := 0x01 varint(n) entry{n};  entry := varint(len key) key varint(len value) value
 * Entries in strictly ascending (bytewise) key order. See statebackend/keys/kernels.py.
 */

#define BLOCK_VERSION 0x01
#define BLOCK_SEED 0x5eedu

static PyObject *py_block_ids(PyObject *self, PyObject *args) {
    PyObject *keys, *out_obj;
    long nbuckets;
    if (!PyArg_ParseTuple(args, "O!Ol:block_ids", &PyList_Type, &keys, &out_obj, &nbuckets))
        return NULL;
    if (nbuckets < 1 || nbuckets > 65535) {
        PyErr_SetString(PyExc_ValueError, "nbuckets must be in 1..65535");
        return NULL;
    }
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (out.itemsize != 8 || out.len != n * 8) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out must be a writable int64 array, one per key");
        return NULL;
    }
    int64_t *o = (int64_t *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) < 2) {
            PyBuffer_Release(&out);
            PyErr_Format(PyExc_ValueError, "key %zd is not a grouping key (bytes of length >= 2)", i);
            return NULL;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(k);
        uint32_t h = hash_bytes(p + 2, PyBytes_GET_SIZE(k) - 2, BLOCK_SEED);
        o[i] = (int64_t)(((uint32_t)p[0] << 8) | p[1]) * nbuckets + (int64_t)(h % (uint32_t)nbuckets);
    }
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Read a varint at *p (< end); -1 and a ValueError when it runs past end or is too long. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 63; shift += 7) {
        if (*p >= end) break;
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    PyErr_SetString(PyExc_ValueError, "corrupt value block: truncated or overlong varint");
    return -1;
}

typedef struct {
    const uint8_t *k, *v;
    Py_ssize_t kn, vn;
} entry_t;

static inline int key_cmp(const uint8_t *a, Py_ssize_t an, const uint8_t *b, Py_ssize_t bn) {
    int c = memcmp(a, b, (size_t)(an < bn ? an : bn));
    return c != 0 ? c : (an < bn ? -1 : an > bn ? 1 : 0);
}

/* key_cmp of a stored key against a bytes object, and of two bytes objects. */
static inline int key_cmp_obj(const uint8_t *a, Py_ssize_t an, PyObject *b) {
    return key_cmp(a, an, (const uint8_t *)PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

static inline int obj_cmp(PyObject *a, PyObject *b) {
    return key_cmp_obj((const uint8_t *)PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a), b);
}

typedef struct {
    entry_t *e;
    Py_ssize_t n, cap;
} entries_t;

static int entries_push(entries_t *es, entry_t e) {
    if (es->n == es->cap) {
        Py_ssize_t cap = es->cap ? es->cap * 2 : 256;
        entry_t *grown = PyMem_Realloc(es->e, (size_t)cap * sizeof(entry_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        es->e = grown;
        es->cap = cap;
    }
    es->e[es->n++] = e;
    return 0;
}

/* Append the entries of one block to `es`, checking the whole format (version byte, entry
 * count, bounds, strictly ascending keys, no trailing bytes); -1 with ValueError if not. */
static int parse_block(const uint8_t *p, Py_ssize_t len, entries_t *es) {
    const uint8_t *end = p + len;
    uint64_t n, kn, vn;
    if (len < 1 || *p != BLOCK_VERSION) {
        PyErr_SetString(PyExc_ValueError, "corrupt value block: unknown version byte");
        return -1;
    }
    p++;
    if (get_varint(&p, end, &n) < 0) return -1;
    if (n > (uint64_t)(end - p) / 2) {
        PyErr_SetString(PyExc_ValueError, "corrupt value block: impossible entry count");
        return -1;
    }
    Py_ssize_t first = es->n;
    for (uint64_t i = 0; i < n; i++) {
        entry_t e;
        if (get_varint(&p, end, &kn) < 0) return -1;
        if (kn > (uint64_t)(end - p)) goto truncated;
        e.k = p;
        e.kn = (Py_ssize_t)kn;
        p += kn;
        if (get_varint(&p, end, &vn) < 0) return -1;
        if (vn > (uint64_t)(end - p)) goto truncated;
        e.v = p;
        e.vn = (Py_ssize_t)vn;
        p += vn;
        if (es->n > first) {
            const entry_t *prev = &es->e[es->n - 1];
            if (key_cmp(prev->k, prev->kn, e.k, e.kn) >= 0) {
                PyErr_SetString(PyExc_ValueError,
                                "corrupt value block: keys out of order or a key twice");
                return -1;
            }
        }
        if (entries_push(es, e) < 0) return -1;
    }
    if (p != end) {
        PyErr_SetString(PyExc_ValueError, "corrupt value block: trailing bytes");
        return -1;
    }
    return 0;
truncated:
    PyErr_SetString(PyExc_ValueError, "corrupt value block: an entry runs past its end");
    return -1;
}

/* Parse every block of `blobs` (bytes or None = empty) into `es`; starts[b]..starts[b+1]
 * are block b's entries. */
static Py_ssize_t *parse_blocks(PyObject *blobs, entries_t *es) {
    Py_ssize_t nb = PyList_GET_SIZE(blobs);
    Py_ssize_t *starts = PyMem_Malloc((size_t)(nb + 1) * sizeof(Py_ssize_t));
    if (starts == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t b = 0; b < nb; b++) {
        starts[b] = es->n;
        PyObject *blob = PyList_GET_ITEM(blobs, b);
        if (blob == Py_None) continue;
        if (!PyBytes_Check(blob)) {
            PyErr_SetString(PyExc_TypeError, "a block must be bytes or None");
            goto fail;
        }
        if (parse_block((const uint8_t *)PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob), es) < 0)
            goto fail;
    }
    starts[nb] = es->n;
    return starts;
fail:
    PyMem_Free(starts);
    return NULL;
}

static PyObject *py_unpack_block(PyObject *self, PyObject *args) {
    Py_buffer in;
    if (!PyArg_ParseTuple(args, "y*:unpack_block", &in)) return NULL;
    entries_t es = {NULL, 0, 0};
    PyObject *d = NULL;
    if (parse_block((const uint8_t *)in.buf, in.len, &es) < 0) goto done;
    d = PyDict_New();
    for (Py_ssize_t i = 0; d != NULL && i < es.n; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)es.e[i].k, es.e[i].kn);
        PyObject *v = k ? PyBytes_FromStringAndSize((const char *)es.e[i].v, es.e[i].vn) : NULL;
        if (v == NULL || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
done:
    PyMem_Free(es.e);
    PyBuffer_Release(&in);
    return d;
}

/* The int64 slots (index into blobs, one per key), checked against the number of blocks. */
static int slots_view(PyObject *obj, Py_buffer *view, Py_ssize_t n, Py_ssize_t nb) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != 8 || view->len != n * 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "slots must be an int64 array, one per key");
        return -1;
    }
    const int64_t *s = (const int64_t *)view->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || s[i] >= nb) {
            PyBuffer_Release(view);
            PyErr_Format(PyExc_IndexError, "slot %lld of key %zd is not a block index",
                         (long long)s[i], i);
            return -1;
        }
    }
    return 0;
}

static int check_keys(PyObject *keys) {
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(PyList_GET_ITEM(keys, i))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return -1;
        }
    }
    return 0;
}

static PyObject *py_blocks_get(PyObject *self, PyObject *args) {
    PyObject *blobs, *slots_obj, *keys;
    if (!PyArg_ParseTuple(args, "O!OO!:blocks_get", &PyList_Type, &blobs, &slots_obj,
                          &PyList_Type, &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (check_keys(keys) < 0) return NULL;
    Py_buffer sv;
    if (slots_view(slots_obj, &sv, n, PyList_GET_SIZE(blobs)) < 0) return NULL;
    const int64_t *slot = (const int64_t *)sv.buf;
    entries_t es = {NULL, 0, 0};
    PyObject *out = NULL;
    Py_ssize_t *starts = parse_blocks(blobs, &es);
    if (starts == NULL) goto done;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *v = NULL;
        Py_ssize_t lo = starts[slot[i]], hi = starts[slot[i] + 1];
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            int c = key_cmp_obj(es.e[mid].k, es.e[mid].kn, key);
            if (c == 0) {
                v = PyBytes_FromStringAndSize((const char *)es.e[mid].v, es.e[mid].vn);
                if (v == NULL) Py_CLEAR(out);
                break;
            }
            if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        if (out == NULL) break;
        if (v == NULL) {
            v = Py_None;
            Py_INCREF(v);
        }
        PyList_SET_ITEM(out, i, v);
    }
done:
    PyMem_Free(starts);
    PyMem_Free(es.e);
    PyBuffer_Release(&sv);
    return out;
}

/* Stable merge sort of idx[0..n) by the bytes keys[idx[i]] (tmp: scratch of n). */
static void sort_by_key(Py_ssize_t *idx, Py_ssize_t *tmp, Py_ssize_t n, PyObject *keys) {
    if (n < 2) return;
    if (n <= 16) {
        for (Py_ssize_t i = 1; i < n; i++) {
            Py_ssize_t x = idx[i], j = i;
            PyObject *kx = PyList_GET_ITEM(keys, x);
            while (j > 0) {
                if (obj_cmp(PyList_GET_ITEM(keys, idx[j - 1]), kx) <= 0) break;
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = x;
        }
        return;
    }
    Py_ssize_t h = n / 2, a = 0, b = h, o = 0;
    sort_by_key(idx, tmp, h, keys);
    sort_by_key(idx + h, tmp, n - h, keys);
    while (a < h && b < n) {
        if (obj_cmp(PyList_GET_ITEM(keys, idx[b]), PyList_GET_ITEM(keys, idx[a])) < 0)
            tmp[o++] = idx[b++];
        else
            tmp[o++] = idx[a++];
    }
    while (a < h) tmp[o++] = idx[a++];
    while (b < n) tmp[o++] = idx[b++];
    memcpy(idx, tmp, (size_t)n * sizeof(Py_ssize_t));
}

/* Emit one merged entry: count/size pass when out == NULL, else write at *out. */
static inline void emit(uint8_t **out, Py_ssize_t *count, Py_ssize_t *size, const uint8_t *k,
                        Py_ssize_t kn, const uint8_t *v, Py_ssize_t vn) {
    if (*out == NULL) {
        (*count)++;
        *size += varint_len((uint64_t)kn) + kn + varint_len((uint64_t)vn) + vn;
        return;
    }
    uint8_t *p = put_varint(*out, (uint64_t)kn);
    memcpy(p, k, (size_t)kn);
    p = put_varint(p + kn, (uint64_t)vn);
    memcpy(p, v, (size_t)vn);
    *out = p + vn;
}

/* Merge block entries [lo, hi) with the sorted updates upd[0..m) (duplicates: the last
 * wins; a None value deletes), either counting (out == NULL) or writing. */
static void merge_block(const entries_t *es, Py_ssize_t lo, Py_ssize_t hi, const Py_ssize_t *upd,
                        Py_ssize_t m, PyObject *keys, PyObject *values, uint8_t **out,
                        Py_ssize_t *count, Py_ssize_t *size) {
    Py_ssize_t j = 0;
    while (lo < hi || j < m) {
        int c;
        PyObject *uk = NULL;
        if (j < m) uk = PyList_GET_ITEM(keys, upd[j]);
        if (lo >= hi) c = 1;
        else if (j >= m) c = -1;
        else c = key_cmp_obj(es->e[lo].k, es->e[lo].kn, uk);
        if (c < 0) {
            emit(out, count, size, es->e[lo].k, es->e[lo].kn, es->e[lo].v, es->e[lo].vn);
            lo++;
            continue;
        }
        if (c == 0) lo++;  /* replaced or deleted */
        /* the last of a run of equal update keys wins */
        while (j + 1 < m) {
            if (obj_cmp(PyList_GET_ITEM(keys, upd[j + 1]), uk) != 0) break;
            j++;
        }
        PyObject *v = PyList_GET_ITEM(values, upd[j]);
        if (v != Py_None)
            emit(out, count, size, (const uint8_t *)PyBytes_AS_STRING(uk), PyBytes_GET_SIZE(uk),
                 (const uint8_t *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
        j++;
    }
}

static PyObject *py_blocks_put(PyObject *self, PyObject *args) {
    PyObject *blobs, *slots_obj, *keys, *values;
    if (!PyArg_ParseTuple(args, "O!OO!O!:blocks_put", &PyList_Type, &blobs, &slots_obj,
                          &PyList_Type, &keys, &PyList_Type, &values))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), nb = PyList_GET_SIZE(blobs);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        return NULL;
    }
    if (check_keys(keys) < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v != Py_None && !PyBytes_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "values must be bytes or None");
            return NULL;
        }
    }
    Py_buffer sv;
    if (slots_view(slots_obj, &sv, n, nb) < 0) return NULL;
    const int64_t *slot = (const int64_t *)sv.buf;
    entries_t es = {NULL, 0, 0};
    PyObject *out = NULL;
    Py_ssize_t *first = NULL, *idx = NULL, *tmp = NULL;
    Py_ssize_t *starts = parse_blocks(blobs, &es);
    if (starts == NULL) goto done;
    /* counting sort of the updates by slot (stable), then by key within each slot */
    first = PyMem_Calloc((size_t)nb + 1, sizeof(Py_ssize_t));
    idx = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    /* scratch: the slot cursors of the counting sort (nb), then the merge sort's (n) */
    tmp = PyMem_Malloc((size_t)(n > nb ? n : nb + 1) * sizeof(Py_ssize_t));
    if (first == NULL || idx == NULL || tmp == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) first[slot[i] + 1]++;
    for (Py_ssize_t b = 0; b < nb; b++) first[b + 1] += first[b];
    memcpy(tmp, first, (size_t)nb * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++) idx[tmp[slot[i]]++] = i;
    out = PyList_New(nb);
    for (Py_ssize_t b = 0; out != NULL && b < nb; b++) {
        Py_ssize_t *upd = idx + first[b], m = first[b + 1] - first[b];
        sort_by_key(upd, tmp, m, keys);
        Py_ssize_t count = 0, size = 0;
        uint8_t *w = NULL;
        merge_block(&es, starts[b], starts[b + 1], upd, m, keys, values, &w, &count, &size);
        PyObject *blob;
        if (count == 0) {
            blob = Py_None;
            Py_INCREF(blob);
        } else {
            size += 1 + varint_len((uint64_t)count);
            blob = PyBytes_FromStringAndSize(NULL, size);
            if (blob == NULL) {
                Py_CLEAR(out);
                break;
            }
            w = (uint8_t *)PyBytes_AS_STRING(blob);
            *w++ = BLOCK_VERSION;
            w = put_varint(w, (uint64_t)count);
            merge_block(&es, starts[b], starts[b + 1], upd, m, keys, values, &w, &count, &size);
        }
        PyList_SET_ITEM(out, b, blob);
    }
done:
    PyMem_Free(first);
    PyMem_Free(idx);
    PyMem_Free(tmp);
    PyMem_Free(starts);
    PyMem_Free(es.e);
    PyBuffer_Release(&sv);
    return out;
}

/* ---- split_fixed -------------------------------------------------------------------- */

static PyObject *py_split_fixed(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*n:split_fixed", &in, &width)) return NULL;
    if (width < 1 || in.len % width != 0) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "the buffer is not a whole number of widths");
        return NULL;
    }
    Py_ssize_t n = in.len / width;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)in.buf + i * width, width);
        if (b == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, b);
    }
    PyBuffer_Release(&in);
    return out;
}

/* ---- sorted_items --------------------------------------------------------------------- */

/* One dict item to sort: the key's first 16 bytes as two big-endian integers (zero
 * padded) decide most comparisons without touching the key object again (encoded keys
 * start with a 2-byte key group and often a shared text prefix). */
typedef struct {
    uint64_t pre[2];
    PyObject *k, *v;
} item_t;

static int item_cmp(const void *pa, const void *pb) {
    const item_t *a = pa, *b = pb;
    if (a->pre[0] != b->pre[0]) return a->pre[0] < b->pre[0] ? -1 : 1;
    if (a->pre[1] != b->pre[1]) return a->pre[1] < b->pre[1] ? -1 : 1;
    return obj_cmp(a->k, b->k);
}

static PyObject *py_sorted_items(PyObject *self, PyObject *arg) {
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "sorted_items expects a dict of bytes keys");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(arg), pos = 0, i = 0;
    /* Everything allocated before the items are collected as borrowed references: no
     * Python object is created after that, so no garbage collection (and no finalizer
     * that could change the dict) runs while they are held. */
    PyObject *ok = PyList_New(n), *ov = PyList_New(n), *res = NULL;
    item_t *items = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(item_t));
    if (ok == NULL || ov == NULL || items == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    if (PyDict_GET_SIZE(arg) != n) {  /* a finalizer run by those allocations changed it */
        PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during sorted_items");
        goto done;
    }
    PyObject *k, *v;
    while (i < n && PyDict_Next(arg, &pos, &k, &v)) {
        if (!PyBytes_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "sorted_items expects a dict of bytes keys");
            goto done;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(k);
        Py_ssize_t len = PyBytes_GET_SIZE(k);
        for (int w = 0; w < 2; w++) {
            uint64_t pre = 0;
            for (Py_ssize_t j = 8 * w; j < 8 * w + 8; j++) pre = (pre << 8) | (j < len ? p[j] : 0);
            items[i].pre[w] = pre;
        }
        items[i].k = k;
        items[i].v = v;
        i++;
    }
    qsort(items, (size_t)n, sizeof(item_t), item_cmp);
    for (i = 0; i < n; i++) {
        Py_INCREF(items[i].k);
        Py_INCREF(items[i].v);
        PyList_SET_ITEM(ok, i, items[i].k);
        PyList_SET_ITEM(ov, i, items[i].v);
    }
    res = PyTuple_Pack(2, ok, ov);
done:
    Py_XDECREF(ok);
    Py_XDECREF(ov);
    PyMem_Free(items);
    return res;
}

static PyMethodDef methods[] = {
    {"hash_columns", py_hash_columns, METH_VARARGS,
     "hash_columns(columns, out, max_parallelism) -> None\n\n"
     "Spark Murmur3 (seed chained per column, nulls skipped) of every row, in place into the\n"
     "int32 array `out` (which holds the seeds); then pmod by max_parallelism if > 0."},
    {"encode_keys", py_encode_keys, METH_VARARGS,
     "encode_keys(columns, key_groups) -> list[bytes]\n\n"
     "2-byte big-endian key group followed by each column's field, for every row."},
    {"split_fixed", py_split_fixed, METH_VARARGS,
     "split_fixed(buffer, width) -> list[bytes]\n\nThe buffer cut into pieces of `width` bytes."},
    {"block_ids", py_block_ids, METH_VARARGS,
     "block_ids(keys, out, nbuckets) -> None\n\n"
     "Block of every grouping key: key_group * nbuckets + Murmur3 (seed 0x5eed) of the key\n"
     "after its 2-byte key group, unsigned mod nbuckets, into the int64 array `out`."},
    {"unpack_block", py_unpack_block, METH_VARARGS,
     "unpack_block(block) -> dict[bytes, bytes]\n\nThe entries of a value block; ValueError "
     "if it is corrupt."},
    {"blocks_get", py_blocks_get, METH_VARARGS,
     "blocks_get(blocks, slots, keys) -> list[bytes | None]\n\n"
     "The value of keys[i] in blocks[slots[i]] (a block is bytes or None = empty)."},
    {"blocks_put", py_blocks_put, METH_VARARGS,
     "blocks_put(blocks, slots, keys, values) -> list[bytes | None]\n\n"
     "Every block with its keys set to their values (the last of equal keys wins, None\n"
     "removes); None for a block left empty."},
    {"sorted_items", py_sorted_items, METH_O,
     "sorted_items(mapping) -> (keys, values)\n\n"
     "The items of a dict with bytes keys as two lists, in bytewise key order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "statebackend._native",
    "Compiled kernels of statebackend (see statebackend/keys/kernels.py for their twins).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&moduledef); }
