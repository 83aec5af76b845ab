/*
 * The compiled PlainBuffer page decoder: the wire ``Record`` messages of one ReadRecords
 * response straight into the raw buffers of the page's Arrow columns.
 *
 * Python side and who calls it: ``connector.tunnel.tablestore.columnar`` (executors, the
 * client's ``read_page`` through ``records.decode_columns``). It is the compiled twin of
 * ``records.decode_columns_python`` and ``plainbuffer.decode_raw``: the same checks in the same
 * order with the same messages, the same after-image rules and the same canonical JSON text
 * (``page.ENCODE_JSON``: sorted keys, compact, ASCII, bytes as {"$binary": base64}, floats as
 * ``float.__repr__``, NaN / Infinity as Python's json writes them). tests/test_decoders.py
 * holds both to identical batches and identical errors.
 *
 * decode_page(records, names, kinds, base_offset) returns one of:
 * - a tuple ``(n, columns)``: ``columns`` holds, per page column in schema order (the
 *   layout's, then _op, _sequence, _commit_ts, _before, _extra), a tuple
 *   ``(null_count, validity bytes or None, buffer 1, buffer 2 or None)`` -- the buffers of
 *   ``pa.Array.from_buffers``;
 * - a str: the page is malformed; the reason of the ``MalformedRecordError`` to raise;
 * - None: the page holds something only the Python path converts (a value whose type differs
 *   from its declared column's, a record that is not a protobuf ``Record`` with bytes fields,
 *   an overflow); the caller decodes the page with it, so the outcome -- the value converted
 *   without loss, or its ``MalformedRecordError`` (connector/tunnel/column_values.py) -- is
 *   the Python path's by construction.
 *
 * ``names``: the layout's column names (UTF-8 bytes); ``kinds``: one byte per column
 * (KIND_* below); ``base_offset``: records of the channel before the page, or None.
 *
 * The GIL is held throughout (each record's fields are read through the Python API).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* --- PlainBuffer constants (plainbuffer.py) ------------------------------------------- */

#define HEADER 0x75
#define TAG_ROW_PK 0x01
#define TAG_ROW_DATA 0x02
#define TAG_CELL 0x03
#define TAG_CELL_NAME 0x04
#define TAG_CELL_VALUE 0x05
#define TAG_CELL_TYPE 0x06
#define TAG_CELL_TIMESTAMP 0x07
#define TAG_DELETE_ROW_MARKER 0x08
#define TAG_ROW_CHECKSUM 0x09
#define TAG_CELL_CHECKSUM 0x0A
#define TAG_EXTENSION 0x0B
#define TAG_SEQ_INFO 0x0C
#define TAG_SEQ_INFO_EPOCH 0x0D
#define TAG_SEQ_INFO_TS 0x0E
#define TAG_SEQ_INFO_ROW_INDEX 0x0F

#define VT_INTEGER 0x0
#define VT_DOUBLE 0x1
#define VT_BOOLEAN 0x2
#define VT_STRING 0x3
#define VT_BLOB 0x7
#define VT_INF_MIN 0x9
#define VT_INF_MAX 0xA
#define VT_AUTO_INCREMENT 0xB

#define OP_PUT 0
#define OP_DELETE_ALL_VERSION 0x1
#define OP_DELETE_ONE_VERSION 0x3
#define OP_INCREMENT 0x4

/* the ActionType of a wire Record (messages.py) */
#define ACTION_PUT_ROW 1
#define ACTION_UPDATE_ROW 2
#define ACTION_DELETE_ROW 3

/* the Arrow type of a layout column (columnar.py KINDS) */
#define KIND_INT64 0
#define KIND_FLOAT64 1
#define KIND_BOOL 2
#define KIND_STRING 3
#define KIND_BINARY 4

/* the latest cell timestamp, 9999-12-31T23:59:59.999Z in ms (plainbuffer.py) */
#define MAX_CELL_TIMESTAMP_MS 253402300799999LL

/* plausible commit times in microseconds since the epoch (records.py) */
#define MIN_TS_US 946684800000000LL
#define MAX_TS_US 7258118400000000LL

/* what a decode step returns */
#define OK 0
#define MALFORMED 1 /* Ctx.reason holds the reason */
#define FALLBACK 2  /* the Python path decides */
#define FAILED (-1) /* a Python exception is set (memory) */

static uint8_t CRC8[256];

static void crc8_init(void) {
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        for (int b = 0; b < 8; b++)
            c = (c & 0x80) ? (uint8_t)((c << 1) ^ 0x07) : (uint8_t)(c << 1);
        CRC8[i] = c;
    }
}

static inline uint8_t crc8(uint8_t crc, const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) crc = CRC8[crc ^ p[i]];
    return crc;
}

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rd_u64(const uint8_t *p) {
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

/* --- growable byte buffers ---------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return FAILED;
        }
        cap *= 2;
    }
    uint8_t *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    b->p = p;
    b->cap = cap;
    return OK;
}

static inline int buf_reserve(Buf *b, Py_ssize_t extra) {
    return b->len + extra <= b->cap ? OK : buf_grow(b, extra);
}

static inline int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (n == 0) return OK; /* b->p may still be NULL */
    if (buf_reserve(b, n) != OK) return FAILED;
    memcpy(b->p + b->len, p, (size_t)n);
    b->len += n;
    return OK;
}

static inline int buf_str(Buf *b, const char *s) { return buf_put(b, s, (Py_ssize_t)strlen(s)); }

static void buf_free(Buf *b) {
    PyMem_Free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static const char HEX[] = "0123456789abcdef";

/* ``width`` lowercase hex digits of ``v`` (zero-padded) */
static inline void hex_fixed(uint8_t *out, uint64_t v, int width) {
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (uint8_t)HEX[v & 0xF];
        v >>= 4;
    }
}

static int buf_hex_bytes(Buf *b, const uint8_t *p, Py_ssize_t n) {
    if (buf_reserve(b, 2 * n) != OK) return FAILED;
    uint8_t *o = b->p + b->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        o[2 * i] = (uint8_t)HEX[p[i] >> 4];
        o[2 * i + 1] = (uint8_t)HEX[p[i] & 0xF];
    }
    b->len += 2 * n;
    return OK;
}

/* --- values and cells ---------------------------------------------------------------------- */

enum { V_NULL, V_INT, V_DBL, V_BOOL, V_STR, V_BIN, V_SPECIAL };

/* One value. STRING / BLOB point into the record's bytes (alive while the record is handled). */
typedef struct {
    uint8_t kind;
    uint8_t vt; /* V_SPECIAL: which placeholder */
    uint32_t n;
    const uint8_t *p;
    union {
        int64_t i;
        double d;
    } u;
} Value;

typedef struct {
    int32_t id; /* into Names */
    uint8_t op;
    uint8_t has_value;
    uint8_t has_ts;
    int64_t ts;
    Value v;
} RawCell;

typedef struct {
    RawCell *cells;
    Py_ssize_t n, cap;
} CellList;

static RawCell *cells_add(CellList *l) {
    if (l->n == l->cap) {
        Py_ssize_t cap = l->cap ? l->cap * 2 : 16;
        RawCell *c = PyMem_Realloc(l->cells, (size_t)cap * sizeof(RawCell));
        if (c == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        l->cells = c;
        l->cap = cap;
    }
    return &l->cells[l->n++];
}

/* --- cell names: interned per page call ------------------------------------------------- */

/* One distinct name of the page: the layout's columns first, then every cell name met. The
 * per-record "dicts" of records.py (key, columns, before, after image) are slots indexed by
 * name id, valid when their stamp is the current record's. */
typedef struct {
    uint8_t *bytes;
    uint32_t len;
    uint32_t hash;
    uint8_t crc;
    uint8_t in_layout;
    uint8_t empty; /* a layout column named "": no cell may take it */
} Name;

typedef struct {
    Name *names;
    Py_ssize_t count, cap;
    int32_t *index; /* open addressing over hash, -1 empty */
    Py_ssize_t index_size;
    /* per-name record slots */
    uint32_t *pk_stamp, *col_stamp, *bef_stamp, *val_stamp;
    Value *col_val, *bef_val, *val_val;
} Names;

static void names_free(Names *t) {
    for (Py_ssize_t i = 0; i < t->count; i++) PyMem_Free(t->names[i].bytes);
    PyMem_Free(t->names);
    PyMem_Free(t->index);
    PyMem_Free(t->pk_stamp);
    PyMem_Free(t->col_stamp);
    PyMem_Free(t->bef_stamp);
    PyMem_Free(t->val_stamp);
    PyMem_Free(t->col_val);
    PyMem_Free(t->bef_val);
    PyMem_Free(t->val_val);
}

static inline uint32_t name_hash(const uint8_t *p, Py_ssize_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static int names_reindex(Names *t, Py_ssize_t size) {
    int32_t *index = PyMem_Malloc((size_t)size * sizeof(int32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    memset(index, 0xFF, (size_t)size * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < t->count; i++) {
        Py_ssize_t j = t->names[i].hash & (size - 1);
        while (index[j] >= 0) j = (j + 1) & (size - 1);
        index[j] = (int32_t)i;
    }
    PyMem_Free(t->index);
    t->index = index;
    t->index_size = size;
    return OK;
}

#define GROW(ptr, type, cap)                                                   \
    do {                                                                       \
        type *np_ = PyMem_Realloc((ptr), (size_t)(cap) * sizeof(type));        \
        if (np_ == NULL) {                                                     \
            PyErr_NoMemory();                                                  \
            return FAILED;                                                     \
        }                                                                      \
        (ptr) = np_;                                                           \
    } while (0)

/* Add a name (not yet present); its id in *id. */
static int names_add(Names *t, const uint8_t *p, uint32_t n, uint32_t hash, int32_t *id) {
    if (t->count == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 32;
        if (cap > INT32_MAX) {
            PyErr_NoMemory();
            return FAILED;
        }
        GROW(t->names, Name, cap);
        GROW(t->pk_stamp, uint32_t, cap);
        GROW(t->col_stamp, uint32_t, cap);
        GROW(t->bef_stamp, uint32_t, cap);
        GROW(t->val_stamp, uint32_t, cap);
        GROW(t->col_val, Value, cap);
        GROW(t->bef_val, Value, cap);
        GROW(t->val_val, Value, cap);
        Py_ssize_t more = cap - t->cap;
        memset(t->pk_stamp + t->cap, 0, (size_t)more * sizeof(uint32_t));
        memset(t->col_stamp + t->cap, 0, (size_t)more * sizeof(uint32_t));
        memset(t->bef_stamp + t->cap, 0, (size_t)more * sizeof(uint32_t));
        memset(t->val_stamp + t->cap, 0, (size_t)more * sizeof(uint32_t));
        t->cap = cap;
    }
    Name *nm = &t->names[t->count];
    nm->bytes = PyMem_Malloc(n ? n : 1);
    if (nm->bytes == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    memcpy(nm->bytes, p, n);
    nm->len = n;
    nm->hash = hash;
    nm->crc = crc8(0, p, n);
    nm->in_layout = 0;
    nm->empty = n == 0;
    *id = (int32_t)t->count++;
    if (t->count * 2 > t->index_size)
        return names_reindex(t, t->index_size ? t->index_size * 2 : 64);
    Py_ssize_t j = hash & (t->index_size - 1);
    while (t->index[j] >= 0) j = (j + 1) & (t->index_size - 1);
    t->index[j] = *id;
    return OK;
}

/* The id of name bytes, or -1. */
static inline int32_t names_find(const Names *t, const uint8_t *p, uint32_t n, uint32_t hash) {
    if (t->index_size == 0) return -1;
    Py_ssize_t j = hash & (t->index_size - 1);
    for (;;) {
        int32_t id = t->index[j];
        if (id < 0) return -1;
        const Name *nm = &t->names[id];
        if (nm->hash == hash && nm->len == n && memcmp(nm->bytes, p, n) == 0) return id;
        j = (j + 1) & (t->index_size - 1);
    }
}

/* Name order: Python sorts str keys by code point, which is the byte order of their UTF-8. */
static inline int name_cmp(const Name *a, const Name *b) {
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->bytes, b->bytes, n);
    if (c) return c;
    return (a->len > b->len) - (a->len < b->len);
}

/* --- UTF-8 (strict, as Python's codec: no surrogates, no overlongs, <= U+10FFFF) ---------- */

static int utf8_valid(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        /* ASCII runs, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if (c == 0xE0 ? (c1 < 0xA0 || c1 > 0xBF)
                          : c == 0xED ? (c1 < 0x80 || c1 > 0x9F) : (c1 & 0xC0) != 0x80)
                return 0;
            if ((s[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if (c == 0xF0 ? (c1 < 0x90 || c1 > 0xBF)
                          : c == 0xF4 ? (c1 < 0x80 || c1 > 0x8F) : (c1 & 0xC0) != 0x80)
                return 0;
            if ((s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* --- decoding one row (plainbuffer._decode), errors as plainbuffer.py words them ----------- */

typedef struct {
    const uint8_t *d;
    Py_ssize_t len;
    Names *names;
    PyObject *reason; /* MALFORMED: the reason, without "record #i: " */
} Ctx;

typedef struct {
    CellList pk, data;
    int marker;
    int has_seq;
    int64_t epoch, ts, idx;
} RawRow;

/* ``reason (at byte offset)``, as PlainBufferError's str */
static int fail(Ctx *c, Py_ssize_t at, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *head = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (head == NULL) return FAILED;
    c->reason = PyUnicode_FromFormat("%U (at byte %zd)", head, at);
    Py_DECREF(head);
    return c->reason == NULL ? FAILED : MALFORMED;
}

/* IndexError / struct.error inside decode_raw */
static int truncated(Ctx *c) {
    return fail(c, c->len, "truncated: the row ends before its checksum");
}

static int tag_error(Ctx *c, Py_ssize_t pos, int tag, const char *what) {
    char want[3] = {HEX[tag >> 4], HEX[tag & 0xF], 0};
    if (pos >= c->len) return fail(c, pos, "truncated: expected %s tag 0x%s", what, want);
    char found[3] = {HEX[c->d[pos] >> 4], HEX[c->d[pos] & 0xF], 0};
    return fail(c, pos, "expected %s tag 0x%s, found 0x%s", what, want, found);
}

/* The name of cell ``id`` as a str (for a message's repr), new reference. */
static PyObject *name_str(Ctx *c, int32_t id) {
    const Name *nm = &c->names->names[id];
    return PyUnicode_DecodeUTF8((const char *)nm->bytes, nm->len, "strict");
}

/* return fail() with the cell's name as the first %R of ``fmt`` (FAIL_NAMED0: and no
 * other argument) */
#define FAIL_NAMED(c, at, id, fmt, ...)                                        \
    do {                                                                       \
        PyObject *nm_ = name_str((c), (id));                                   \
        if (nm_ == NULL) return FAILED;                                        \
        int r_ = fail((c), (at), (fmt), nm_, __VA_ARGS__);                     \
        Py_DECREF(nm_);                                                        \
        return r_;                                                             \
    } while (0)
#define FAIL_NAMED0(c, at, id, fmt)                                            \
    do {                                                                       \
        PyObject *nm_ = name_str((c), (id));                                   \
        if (nm_ == NULL) return FAILED;                                        \
        int r_ = fail((c), (at), (fmt), nm_);                                  \
        Py_DECREF(nm_);                                                        \
        return r_;                                                             \
    } while (0)

static void hex2(char *out, unsigned v) {
    out[0] = HEX[(v >> 4) & 0xF];
    out[1] = HEX[v & 0xF];
    out[2] = 0;
}

static const char *special_name(uint8_t vt) {
    return vt == VT_INF_MIN ? "INF_MIN" : vt == VT_INF_MAX ? "INF_MAX" : "AUTO_INCREMENT";
}

/* At pos: 0x05 u32 len VT payload (plainbuffer._read_value). */
static int read_value(Ctx *c, Py_ssize_t pos, int32_t id, Value *v, Py_ssize_t *stop_out) {
    const uint8_t *d = c->d;
    if (pos + 5 > c->len) return truncated(c);
    uint32_t length = rd_u32(d + pos + 1);
    Py_ssize_t start = pos + 5;
    Py_ssize_t stop = start + (Py_ssize_t)length;
    if (length < 1) FAIL_NAMED0(c, pos, id, "value of %R has length 0");
    if (stop > c->len)
        FAIL_NAMED(c, start, id, "truncated: value of %R needs %lu byte(s)",
                   (unsigned long)length);
    uint8_t vt = d[start];
    if (vt == VT_INTEGER || vt == VT_DOUBLE) {
        if (length != 9)
            FAIL_NAMED(c, start, id, "value of %R: an 8-byte type with length %lu",
                       (unsigned long)length);
        uint64_t bits = rd_u64(d + start + 1);
        if (vt == VT_INTEGER) {
            v->kind = V_INT;
            v->u.i = (int64_t)bits;
        } else {
            v->kind = V_DBL;
            memcpy(&v->u.d, &bits, 8);
        }
    } else if (vt == VT_STRING || vt == VT_BLOB) {
        if (start + 5 > c->len) return truncated(c);
        uint32_t n = rd_u32(d + start + 1);
        if ((uint64_t)length != 5 + (uint64_t)n)
            FAIL_NAMED(c, start, id, "value of %R: inner length %lu does not match outer %lu",
                       (unsigned long)n, (unsigned long)length);
        v->p = d + start + 5;
        v->n = n;
        if (vt == VT_BLOB) {
            v->kind = V_BIN;
        } else {
            if (!utf8_valid(v->p, n))
                FAIL_NAMED0(c, start, id, "value of %R: STRING is not UTF-8");
            v->kind = V_STR;
        }
    } else if (vt == VT_BOOLEAN) {
        if (length != 2)
            FAIL_NAMED(c, start, id, "value of %R: a boolean with length %lu",
                       (unsigned long)length);
        uint8_t b = d[start + 1];
        if (b > 1) FAIL_NAMED(c, start + 1, id, "value of %R: boolean byte %d", (int)b);
        v->kind = V_BOOL;
        v->u.i = b;
    } else if (vt == VT_INF_MIN || vt == VT_INF_MAX || vt == VT_AUTO_INCREMENT) {
        if (length != 1)
            FAIL_NAMED(c, start, id, "value of %R: a placeholder with length %lu",
                       (unsigned long)length);
        v->kind = V_SPECIAL;
        v->vt = vt;
    } else {
        char h[3];
        hex2(h, vt);
        FAIL_NAMED(c, start, id, "value of %R: unknown value type 0x%s", h);
    }
    *stop_out = stop;
    return OK;
}

/* At pos: one cell, its TAG_CELL included (plainbuffer._read_cell). */
static int read_cell(Ctx *c, Py_ssize_t pos, int in_pk, RawCell *cell, uint8_t *crc_out,
                     Py_ssize_t *pos_out) {
    const uint8_t *d = c->d;
    Py_ssize_t len = c->len;
    if (pos + 1 >= len) return truncated(c);
    if (d[pos + 1] != TAG_CELL_NAME) return tag_error(c, pos + 1, TAG_CELL_NAME, "cell name");
    if (pos + 6 > len) return truncated(c);
    uint32_t n = rd_u32(d + pos + 2);
    pos += 6;
    if (pos + (Py_ssize_t)n > len)
        return fail(c, pos, "truncated: cell name needs %lu byte(s)", (unsigned long)n);
    uint32_t hash = name_hash(d + pos, n);
    int32_t id = names_find(c->names, d + pos, n, hash);
    if (id < 0) {
        if (!utf8_valid(d + pos, n)) return fail(c, pos, "cell name is not UTF-8");
        if (n == 0) return fail(c, pos, "empty cell name");
        if (names_add(c->names, d + pos, n, hash, &id) != OK) return FAILED;
    } else if (c->names->names[id].empty) {
        return fail(c, pos + n, "empty cell name");
    }
    pos += n;
    uint8_t crc = c->names->names[id].crc;
    cell->id = id;
    cell->has_value = 0;
    cell->v.kind = V_NULL;
    if (pos < len && d[pos] == TAG_CELL_VALUE) {
        Py_ssize_t stop = 0;
        int r = read_value(c, pos, id, &cell->v, &stop);
        if (r != OK) return r;
        crc = crc8(crc, d + pos + 5, stop - pos - 5);
        pos = stop;
        cell->has_value = 1;
    }
    uint8_t op = OP_PUT;
    if (pos < len && d[pos] == TAG_CELL_TYPE) {
        if (pos + 1 >= len) return truncated(c);
        op = d[pos + 1];
        if (op != OP_DELETE_ALL_VERSION && op != OP_DELETE_ONE_VERSION && op != OP_INCREMENT) {
            char h[3];
            hex2(h, op);
            FAIL_NAMED(c, pos + 1, id, "cell %R: unknown op 0x%s", h);
        }
        pos += 2;
    }
    cell->op = op;
    cell->has_ts = 0;
    if (pos < len && d[pos] == TAG_CELL_TIMESTAMP) {
        if (pos + 9 > len) return truncated(c);
        int64_t ts = (int64_t)rd_u64(d + pos + 1);
        crc = crc8(crc, d + pos + 1, 8);
        if (ts < 0) FAIL_NAMED(c, pos + 1, id, "cell %R: negative timestamp %lld", (long long)ts);
        if (ts > MAX_CELL_TIMESTAMP_MS)
            FAIL_NAMED(c, pos + 1, id, "cell %R: timestamp %lld ms is after the year 9999",
                       (long long)ts);
        cell->ts = ts;
        cell->has_ts = 1;
        pos += 9;
    }
    if (op) crc = CRC8[crc ^ op];
    if (pos >= len) return truncated(c);
    if (d[pos] != TAG_CELL_CHECKSUM) return tag_error(c, pos, TAG_CELL_CHECKSUM, "cell checksum");
    if (pos + 1 >= len) return truncated(c);
    uint8_t stored = d[pos + 1];
    if (stored != crc) {
        char hs[3], hc[3];
        hex2(hs, stored);
        hex2(hc, crc);
        FAIL_NAMED(c, pos + 1, id, "cell %R: checksum 0x%s != computed 0x%s", hs, hc);
    }
    pos += 2;
    if (in_pk) {
        if (!cell->has_value || op || cell->has_ts)
            FAIL_NAMED0(c, pos, id, "primary-key cell %R must have a value and nothing else");
    } else if (!op && !cell->has_value) {
        FAIL_NAMED0(c, pos, id, "cell %R: a put without a value");
    } else if ((op == OP_DELETE_ALL_VERSION || op == OP_DELETE_ONE_VERSION) && cell->has_value) {
        FAIL_NAMED0(c, pos, id, "cell %R: a delete with a value");
    } else if (op == OP_DELETE_ALL_VERSION && cell->has_ts) {
        FAIL_NAMED0(c, pos, id, "cell %R: DELETE_ALL_VERSION with a timestamp");
    }
    if (!in_pk && cell->v.kind == V_SPECIAL)
        FAIL_NAMED(c, pos, id, "cell %R: %s is only valid in a primary key",
                   special_name(cell->v.vt));
    *crc_out = crc;
    *pos_out = pos;
    return OK;
}

/* At pos: 0x0B u32 len {0x0C u32 len seq-info} (plainbuffer._read_extension). */
static int read_extension(Ctx *c, Py_ssize_t pos, RawRow *row, Py_ssize_t *pos_out) {
    const uint8_t *d = c->d;
    if (pos + 5 > c->len) return truncated(c);
    uint32_t length = rd_u32(d + pos + 1);
    pos += 5;
    Py_ssize_t stop = pos + (Py_ssize_t)length;
    if (stop > c->len)
        return fail(c, pos, "truncated: extension needs %lu byte(s)", (unsigned long)length);
    while (pos < stop) {
        uint8_t tag = d[pos];
        if (pos + 5 > c->len) return truncated(c);
        uint32_t n = rd_u32(d + pos + 1);
        pos += 5;
        if (pos + (Py_ssize_t)n > stop) {
            char h[3];
            hex2(h, tag);
            return fail(c, pos, "extension item 0x%s of %lu bytes overruns the extension", h,
                        (unsigned long)n);
        }
        if (tag != TAG_SEQ_INFO) {
            pos += n; /* an extension this reader does not know: skip it */
            continue;
        }
        if (n != 19)
            return fail(c, pos, "sequence info of %lu bytes (expected 19)", (unsigned long)n);
        if (d[pos] != TAG_SEQ_INFO_EPOCH)
            return tag_error(c, pos, TAG_SEQ_INFO_EPOCH, "sequence epoch");
        if (d[pos + 5] != TAG_SEQ_INFO_TS)
            return tag_error(c, pos + 5, TAG_SEQ_INFO_TS, "sequence timestamp");
        if (d[pos + 14] != TAG_SEQ_INFO_ROW_INDEX)
            return tag_error(c, pos + 14, TAG_SEQ_INFO_ROW_INDEX, "sequence row index");
        int32_t epoch = (int32_t)rd_u32(d + pos + 1);
        int64_t ts = (int64_t)rd_u64(d + pos + 6);
        int32_t idx = (int32_t)rd_u32(d + pos + 15);
        if (epoch < 0 || ts < 0 || idx < 0)
            return fail(c, pos, "negative sequence info (%d, %lld, %d)", (int)epoch,
                        (long long)ts, (int)idx);
        row->has_seq = 1;
        row->epoch = epoch;
        row->ts = ts;
        row->idx = idx;
        pos += n;
    }
    *pos_out = pos;
    return OK;
}

/* One row, the whole of c->d (plainbuffer._decode with header=True). */
static int decode_row(Ctx *c, int allow_empty_pk, RawRow *row) {
    const uint8_t *d = c->d;
    Py_ssize_t len = c->len;
    row->pk.n = row->data.n = 0;
    row->marker = row->has_seq = 0;
    if (len < 4) return truncated(c);
    if (rd_u32(d) != HEADER) return fail(c, 0, "bad header (not PlainBuffer 0x75)");
    Py_ssize_t pos = 4;
    if (pos >= len) return truncated(c);
    if (d[pos] != TAG_ROW_PK) return tag_error(c, pos, TAG_ROW_PK, "row primary key");
    pos++;
    uint8_t row_crc = 0, crc;
    int r;
    while (pos < len && d[pos] == TAG_CELL) {
        RawCell *cell = cells_add(&row->pk);
        if (cell == NULL) return FAILED;
        if ((r = read_cell(c, pos, 1, cell, &crc, &pos)) != OK) return r;
        row_crc = CRC8[row_crc ^ crc];
    }
    if (row->pk.n == 0 && !allow_empty_pk)
        return fail(c, pos, "a row without primary-key columns");
    if (pos < len && d[pos] == TAG_ROW_DATA) {
        pos++;
        while (pos < len && d[pos] == TAG_CELL) {
            RawCell *cell = cells_add(&row->data);
            if (cell == NULL) return FAILED;
            if ((r = read_cell(c, pos, 0, cell, &crc, &pos)) != OK) return r;
            row_crc = CRC8[row_crc ^ crc];
        }
    }
    row->marker = pos < len && d[pos] == TAG_DELETE_ROW_MARKER;
    if (row->marker) pos++;
    row_crc = CRC8[row_crc ^ (row->marker ? 1 : 0)];
    if (pos < len && d[pos] == TAG_EXTENSION) {
        if ((r = read_extension(c, pos, row, &pos)) != OK) return r;
    }
    if (pos >= len) return truncated(c);
    if (d[pos] != TAG_ROW_CHECKSUM) return tag_error(c, pos, TAG_ROW_CHECKSUM, "row checksum");
    if (pos + 1 >= len) return truncated(c);
    uint8_t stored = d[pos + 1];
    if (stored != row_crc) {
        char hs[3], hc[3];
        hex2(hs, stored);
        hex2(hc, row_crc);
        return fail(c, pos + 1, "row checksum 0x%s != computed 0x%s", hs, hc);
    }
    pos += 2;
    if (pos != len) return fail(c, pos, "%zd byte(s) after the row", len - pos);
    return OK;
}

/* --- canonical JSON (page.ENCODE_JSON) --------------------------------------------------- */

/* A JSON string of valid UTF-8, escaped as json's ensure_ascii encoder does. */
static int json_string(Buf *b, const uint8_t *s, Py_ssize_t n) {
    /* worst case: 12 output bytes per 4 input bytes (a surrogate pair), 6 per byte below */
    if (buf_reserve(b, 6 * n + 2) != OK) return FAILED;
    uint8_t *o = b->p + b->len;
    *o++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t ch = s[i];
        if (ch >= ' ' && ch <= '~' && ch != '"' && ch != '\\') {
            *o++ = ch;
            i++;
            continue;
        }
        uint32_t cp;
        if (ch < 0x80) {
            cp = ch;
            i++;
        } else if (ch < 0xE0) {
            cp = (uint32_t)(ch & 0x1F) << 6 | (s[i + 1] & 0x3F);
            i += 2;
        } else if (ch < 0xF0) {
            cp = (uint32_t)(ch & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
            i += 3;
        } else {
            cp = (uint32_t)(ch & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                 (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
            i += 4;
        }
        *o++ = '\\';
        switch (cp) {
            case '\\': *o++ = '\\'; break;
            case '"': *o++ = '"'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            default:
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    uint32_t hi = 0xD800 | ((v >> 10) & 0x3FF), lo = 0xDC00 | (v & 0x3FF);
                    *o++ = 'u';
                    hex_fixed(o, hi, 4);
                    o += 4;
                    *o++ = '\\';
                    cp = lo;
                }
                *o++ = 'u';
                hex_fixed(o, cp, 4);
                o += 4;
        }
    }
    *o++ = '"';
    b->len = o - b->p;
    return OK;
}

static int buf_int(Buf *b, int64_t v) {
    char tmp[24];
    int k = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (buf_reserve(b, k + 1) != OK) return FAILED;
    if (v < 0) b->p[b->len++] = '-';
    while (k) b->p[b->len++] = (uint8_t)tmp[--k];
    return OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int json_binary(Buf *b, const uint8_t *s, Py_ssize_t n) {
    if (buf_reserve(b, 14 + (n + 2) / 3 * 4) != OK) return FAILED;
    uint8_t *o = b->p + b->len;
    memcpy(o, "{\"$binary\":\"", 12);
    o += 12;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
        *o++ = (uint8_t)B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
        *o++ = '=';
    }
    *o++ = '"';
    *o++ = '}';
    b->len = o - b->p;
    return OK;
}

static int json_value(Buf *b, const Value *v) {
    switch (v->kind) {
        case V_NULL: return buf_str(b, "null");
        case V_INT: return buf_int(b, v->u.i);
        case V_BOOL: return buf_str(b, v->u.i ? "true" : "false");
        case V_STR: return json_string(b, v->p, v->n);
        case V_BIN: return json_binary(b, v->p, v->n);
        case V_DBL: {
            double x = v->u.d;
            if (isnan(x)) return buf_str(b, "NaN");
            if (isinf(x)) return buf_str(b, x > 0 ? "Infinity" : "-Infinity");
            /* float.__repr__, which json uses for finite floats */
            char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (s == NULL) return FAILED;
            int r = buf_str(b, s);
            PyMem_Free(s);
            return r;
        }
        default: return FALLBACK; /* a range bound: json raises TypeError, as the Python path */
    }
}

/* ids sorted by name (insertion sort: a record has few cells) */
static void sort_ids(const Names *t, int32_t *ids, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        int32_t x = ids[i];
        Py_ssize_t j = i;
        while (j > 0 && name_cmp(&t->names[ids[j - 1]], &t->names[x]) > 0) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = x;
    }
}

/* {"name":value,...} of ``ids`` (sorted here) with values from ``vals``. */
static int json_object(Buf *b, const Names *t, int32_t *ids, Py_ssize_t n, const Value *vals) {
    sort_ids(t, ids, n);
    if (buf_put(b, "{", 1) != OK) return FAILED;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Name *nm = &t->names[ids[i]];
        if (i && buf_put(b, ",", 1) != OK) return FAILED;
        if (json_string(b, nm->bytes, nm->len) != OK) return FAILED;
        if (buf_put(b, ":", 1) != OK) return FAILED;
        int r = json_value(b, &vals[ids[i]]);
        if (r != OK) return r;
    }
    return buf_put(b, "}", 1);
}

/* --- the page's columns ------------------------------------------------------------------- */

typedef struct {
    int kind;       /* KIND_* (layout columns), or KIND_STRING / KIND_INT64 for metadata */
    int32_t id;     /* the layout column's name id */
    int nullable;
    uint8_t *validity; /* (n + 7) / 8 bytes, zeroed */
    Py_ssize_t nulls;
    uint8_t *fixed; /* int64 / float64 values, bool bits, or int32 offsets */
    Buf data;       /* string / binary bytes */
} Column;

static int column_init(Column *col, int kind, Py_ssize_t n) {
    col->kind = kind;
    col->nulls = 0;
    Py_ssize_t bits = (n + 7) / 8 + 1;
    Py_ssize_t fixed = kind == KIND_BOOL ? bits
                       : kind == KIND_STRING || kind == KIND_BINARY ? (n + 1) * 4
                                                                    : n * 8 + 1;
    col->validity = PyMem_Calloc((size_t)bits, 1);
    col->fixed = PyMem_Calloc((size_t)fixed, 1);
    memset(&col->data, 0, sizeof(Buf));
    if (col->validity == NULL || col->fixed == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    return OK;
}

static void column_free(Column *col) {
    PyMem_Free(col->validity);
    PyMem_Free(col->fixed);
    buf_free(&col->data);
}

static inline void set_valid(Column *col, Py_ssize_t row) {
    col->validity[row >> 3] |= (uint8_t)(1u << (row & 7));
}

/* the end offset of row ``row`` of a string / binary column (after its bytes were appended) */
static inline int close_string(Column *col, Py_ssize_t row) {
    if (col->data.len > INT32_MAX) return FALLBACK; /* pyarrow would chunk it: its path */
    ((int32_t *)col->fixed)[row + 1] = (int32_t)col->data.len;
    return OK;
}

static inline int put_null(Column *col, Py_ssize_t row) {
    col->nulls++;
    if (col->kind == KIND_STRING || col->kind == KIND_BINARY) return close_string(col, row);
    return OK;
}

/* One value into a layout column: nulls and values of exactly the column's type; anything
 * else is pyarrow's conversion (or its error) on the Python path. */
static int put_value(Column *col, Py_ssize_t row, const Value *v) {
    if (v->kind == V_NULL) return put_null(col, row);
    switch (col->kind) {
        case KIND_INT64:
            if (v->kind != V_INT) return FALLBACK;
            ((int64_t *)col->fixed)[row] = v->u.i;
            break;
        case KIND_FLOAT64:
            if (v->kind != V_DBL) return FALLBACK;
            ((double *)col->fixed)[row] = v->u.d;
            break;
        case KIND_BOOL:
            if (v->kind != V_BOOL) return FALLBACK;
            if (v->u.i) col->fixed[row >> 3] |= (uint8_t)(1u << (row & 7));
            break;
        case KIND_STRING:
        case KIND_BINARY: {
            if (v->kind != (col->kind == KIND_STRING ? V_STR : V_BIN)) return FALLBACK;
            if (buf_put(&col->data, v->p, v->n) != OK) return FAILED;
            int r = close_string(col, row);
            if (r != OK) return r;
            break;
        }
        default: return FALLBACK;
    }
    set_valid(col, row);
    return OK;
}

/* a finished column -> (null_count, validity or None, buffer 1, buffer 2 or None) */
static PyObject *column_out(Column *col, Py_ssize_t n) {
    PyObject *validity, *b1, *b2;
    if (col->nulls) {
        validity = PyBytes_FromStringAndSize((const char *)col->validity, (n + 7) / 8);
    } else {
        validity = Py_NewRef(Py_None);
    }
    int var = col->kind == KIND_STRING || col->kind == KIND_BINARY;
    Py_ssize_t size = col->kind == KIND_BOOL ? (n + 7) / 8 : var ? (n + 1) * 4 : n * 8;
    b1 = PyBytes_FromStringAndSize((const char *)col->fixed, size);
    if (var) {
        b2 = PyBytes_FromStringAndSize(col->data.p ? (const char *)col->data.p : "",
                                       col->data.len);
    } else {
        b2 = Py_NewRef(Py_None);
    }
    if (validity == NULL || b1 == NULL || b2 == NULL) {
        Py_XDECREF(validity);
        Py_XDECREF(b1);
        Py_XDECREF(b2);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(nNNN)", col->nulls, validity, b1, b2);
    return out;
}

/* --- one page ------------------------------------------------------------------------------ */

typedef struct {
    Names names;
    Py_ssize_t ncols; /* layout columns */
    Column *cols;     /* layout columns, then _op, _sequence, _commit_ts, _before, _extra */
    RawRow row, origin;
    int32_t *ids; /* scratch: the ids of one record's dict */
    Py_ssize_t ids_cap;
    int32_t *col_ids, *bef_ids, *val_ids;
    Py_ssize_t n_col, n_bef, n_val;
    PyObject *reason;
    /* the records' class and its HasField, looked up once per page: calling the unbound
     * method skips making a bound method per record */
    PyTypeObject *has_field_type;
    PyObject *has_field;
} Page;

static PyObject *S_action_type, *S_record, *S_origin_record, *S_HasField;

static int ensure_ids(Page *pg, Py_ssize_t need) {
    if (need <= pg->ids_cap) return OK;
    Py_ssize_t cap = pg->ids_cap ? pg->ids_cap : 64;
    while (cap < need) cap *= 2;
    GROW(pg->col_ids, int32_t, cap);
    GROW(pg->bef_ids, int32_t, cap);
    GROW(pg->val_ids, int32_t, cap);
    GROW(pg->ids, int32_t, cap);
    pg->ids_cap = cap;
    return OK;
}

static inline void val_set(Page *pg, uint32_t stamp, int32_t id, const Value *v) {
    Names *t = &pg->names;
    if (t->val_stamp[id] != stamp) {
        t->val_stamp[id] = stamp;
        pg->val_ids[pg->n_val++] = id;
    }
    t->val_val[id] = *v;
}

/* wire.HasField("origin_record") */
static PyObject *has_field(Page *pg, PyObject *wire) {
    if (Py_TYPE(wire) != pg->has_field_type) {
        Py_CLEAR(pg->has_field);
        pg->has_field_type = Py_TYPE(wire);
        pg->has_field = PyObject_GetAttr((PyObject *)Py_TYPE(wire), S_HasField);
        if (pg->has_field == NULL) PyErr_Clear();
    }
    if (pg->has_field == NULL) return PyObject_CallMethodOneArg(wire, S_HasField, S_origin_record);
    PyObject *args[] = {wire, S_origin_record};
    return PyObject_Vectorcall(pg->has_field, args, 2, NULL);
}

/* "record #i: <reason>" */
static int record_error(Page *pg, Py_ssize_t i, PyObject *reason) {
    pg->reason = PyUnicode_FromFormat("record #%zd: %U", i, reason);
    Py_DECREF(reason);
    return pg->reason == NULL ? FAILED : MALFORMED;
}

static int record_error_named(Page *pg, Py_ssize_t i, int32_t id, const char *fmt) {
    Ctx c = {NULL, 0, &pg->names, NULL};
    PyObject *nm = name_str(&c, id);
    if (nm == NULL) return FAILED;
    PyObject *reason = PyUnicode_FromFormat(fmt, nm);
    Py_DECREF(nm);
    if (reason == NULL) return FAILED;
    return record_error(pg, i, reason);
}

/* One PlainBuffer row of record #i (its ``record`` or ``origin_record`` bytes). */
static int decode_bytes(Page *pg, Py_ssize_t i, const uint8_t *bytes, Py_ssize_t size,
                        int allow_empty_pk, RawRow *row) {
    Ctx c = {bytes, size, &pg->names, NULL};
    int r = decode_row(&c, allow_empty_pk, row);
    return r == MALFORMED ? record_error(pg, i, c.reason) : r;
}

/* key_order_string(): the key's order-preserving encoding (a base record's sequence) */
static int key_order(Buf *b, const CellList *pk) {
    for (Py_ssize_t k = 0; k < pk->n; k++) {
        const Value *v = &pk->cells[k].v;
        if (k && buf_put(b, "!", 1) != OK) return FAILED;
        if (buf_reserve(b, 16) != OK) return FAILED;
        switch (v->kind) {
            case V_BOOL:
                hex_fixed(b->p + b->len, (uint64_t)v->u.i, 2);
                b->len += 2;
                break;
            case V_INT:
                hex_fixed(b->p + b->len, (uint64_t)v->u.i ^ 0x8000000000000000ULL, 16);
                b->len += 16;
                break;
            case V_STR:
            case V_BIN:
                if (buf_hex_bytes(b, v->p, v->n) != OK) return FAILED;
                break;
            case V_DBL: {
                uint64_t bits;
                memcpy(&bits, &v->u.d, 8);
                hex_fixed(b->p + b->len, bits, 16); /* struct.pack(">d").hex() */
                b->len += 16;
                break;
            }
            default: return FALLBACK; /* float(range bound) raises TypeError */
        }
    }
    return OK;
}

/* What the decoder reads of one wire record: from a protobuf ``Record`` object
 * (``record_parts``) or from the spans ``scan_read_records`` found in a response's bytes. The
 * spans point into bytes the caller keeps alive while the page decodes. */
typedef struct {
    long action;
    const uint8_t *record;
    Py_ssize_t record_len;
    int has_before; /* origin_record is set (maybe empty) */
    const uint8_t *origin;
    Py_ssize_t origin_len;
} Parts;

/* One wire record (records.decode_one, then its sequence as _decode_all assigns it, then its
 * row of every column as decode_columns_python builds it). */
static int decode_record(Page *pg, Py_ssize_t i, const Parts *w, int has_base,
                         int64_t base_offset, Py_ssize_t *with_seq) {
    Names *t = &pg->names;
    uint32_t stamp = (uint32_t)i + 1;
    int r;
    long action = w->action;
    if (action != ACTION_PUT_ROW && action != ACTION_UPDATE_ROW && action != ACTION_DELETE_ROW) {
        PyObject *reason = PyUnicode_FromFormat("unknown action type %ld", action);
        return reason == NULL ? FAILED : record_error(pg, i, reason);
    }
    if ((r = decode_bytes(pg, i, w->record, w->record_len, 0, &pg->row)) != OK) return r;

    /* the key: no placeholder (a range bound) as a value */
    const CellList *pk = &pg->row.pk;
    for (Py_ssize_t k = 0; k < pk->n; k++) {
        if (pk->cells[k].v.kind == V_SPECIAL) {
            Ctx c = {NULL, 0, t, NULL};
            PyObject *nm = name_str(&c, pk->cells[k].id);
            if (nm == NULL) return FAILED;
            PyObject *reason = PyUnicode_FromFormat(
                "key column %R holds %s, a placeholder that is not a value", nm,
                special_name(pk->cells[k].v.vt));
            Py_DECREF(nm);
            return reason == NULL ? FAILED : record_error(pg, i, reason);
        }
    }
    /* the key: a dict of its cells; a name twice is an error */
    for (Py_ssize_t k = 0; k < pk->n; k++) {
        int32_t id = pk->cells[k].id;
        if (t->pk_stamp[id] == stamp) {
            PyObject *reason = PyUnicode_FromString("a key column appears twice");
            r = reason == NULL ? FAILED : record_error(pg, i, reason);
            return r;
        }
        t->pk_stamp[id] = stamp;
    }
    if ((r = ensure_ids(pg, pk->n + 2 * pg->row.data.n + 1)) != OK) return r;

    /* the columns: put cells' values, delete cells' None (not for a DELETE) */
    pg->n_col = 0;
    const CellList *data = &pg->row.data;
    if (action != ACTION_DELETE_ROW) {
        for (Py_ssize_t k = 0; k < data->n; k++) {
            const RawCell *cell = &data->cells[k];
            Value none = {V_NULL};
            const Value *v = &cell->v;
            if (cell->op == OP_INCREMENT) {
                r = record_error_named(pg, i, cell->id,
                                       "column %R: an INCREMENT cell in a change record");
                return r;
            } else if (cell->op) {
                if (action == ACTION_PUT_ROW) {
                    r = record_error_named(pg, i, cell->id,
                                           "column %R: a delete cell in a PUT_ROW record");
                    return r;
                }
                v = &none;
            }
            if (t->col_stamp[cell->id] != stamp) {
                t->col_stamp[cell->id] = stamp;
                pg->col_ids[pg->n_col++] = cell->id;
            }
            t->col_val[cell->id] = *v;
        }
    }

    /* the before-image: the origin record's put cells */
    pg->n_bef = 0;
    if (w->has_before) {
        if ((r = decode_bytes(pg, i, w->origin, w->origin_len, 1, &pg->origin)) != OK)
            return r;
        const CellList *od = &pg->origin.data;
        if ((r = ensure_ids(pg, pk->n + data->n + od->n + 1)) != OK) return r;
        for (Py_ssize_t k = 0; k < od->n; k++) {
            const RawCell *cell = &od->cells[k];
            if (cell->op) continue;
            if (t->bef_stamp[cell->id] != stamp) {
                t->bef_stamp[cell->id] = stamp;
                pg->bef_ids[pg->n_bef++] = cell->id;
            }
            t->bef_val[cell->id] = cell->v;
        }
    }

    /* the sequence and the commit time */
    Column *cols = pg->cols;
    Py_ssize_t L = pg->ncols;
    Column *c_op = &cols[L], *c_seq = &cols[L + 1], *c_ts = &cols[L + 2];
    Column *c_before = &cols[L + 3], *c_extra = &cols[L + 4];
    int64_t commit;
    if (pg->row.has_seq) {
        if (buf_reserve(&c_seq->data, 34) != OK) {
            r = FAILED;
            return r;
        }
        uint8_t *o = c_seq->data.p + c_seq->data.len;
        hex_fixed(o, (uint64_t)pg->row.epoch, 8);
        o[8] = ':';
        hex_fixed(o + 9, (uint64_t)pg->row.ts, 16);
        o[25] = ':';
        hex_fixed(o + 26, (uint64_t)pg->row.idx, 8);
        c_seq->data.len += 34;
        commit = pg->row.ts;
        if (commit < MIN_TS_US || commit > MAX_TS_US) {
            PyObject *reason = PyUnicode_FromFormat(
                "sequence timestamp %lld is not microseconds since the epoch between 2000 and "
                "2200", (long long)commit);
            r = reason == NULL ? FAILED : record_error(pg, i, reason);
            return r;
        }
        ++*with_seq;
    } else {
        int64_t ts_ms = 0;
        for (Py_ssize_t k = 0; k < data->n; k++)
            if (data->cells[k].has_ts && data->cells[k].ts > ts_ms) ts_ms = data->cells[k].ts;
        if (ts_ms > INT64_MAX / 1000) {
            r = FALLBACK; /* pyarrow's overflow, on the Python path */
            return r;
        }
        commit = ts_ms * 1000;
        if (buf_put(&c_seq->data, "!", 1) != OK) {
            r = FAILED;
            return r;
        }
        if (has_base) {
            if (base_offset > INT64_MAX - (int64_t)i - 1 || base_offset + i + 1 < 0) {
                r = FALLBACK;
                return r;
            }
            if (buf_reserve(&c_seq->data, 16) != OK) {
                r = FAILED;
                return r;
            }
            hex_fixed(c_seq->data.p + c_seq->data.len, (uint64_t)(base_offset + i + 1), 16);
            c_seq->data.len += 16;
        } else if ((r = key_order(&c_seq->data, pk)) != OK) {
            return r;
        }
    }
    if ((r = close_string(c_seq, i)) != OK) return r;
    ((int64_t *)c_ts->fixed)[i] = commit;

    /* the op */
    static const char *OPS[] = {"", "PUT", "UPDATE", "DELETE"};
    if (buf_str(&c_op->data, OPS[action]) != OK || close_string(c_op, i) != OK) {
        r = FAILED;
        return r;
    }

    /* the row after the change (records.decode_columns_python) */
    pg->n_val = 0;
    for (Py_ssize_t k = 0; k < pk->n; k++) val_set(pg, stamp, pk->cells[k].id, &pk->cells[k].v);
    if (action == ACTION_UPDATE_ROW && w->has_before) {
        /* {**before, **columns} without the None values, over the key */
        for (Py_ssize_t k = 0; k < pg->n_bef; k++) {
            int32_t id = pg->bef_ids[k];
            if (t->col_stamp[id] != stamp) val_set(pg, stamp, id, &t->bef_val[id]);
        }
        for (Py_ssize_t k = 0; k < pg->n_col; k++) {
            int32_t id = pg->col_ids[k];
            if (t->col_val[id].kind != V_NULL) val_set(pg, stamp, id, &t->col_val[id]);
        }
    } else if (action != ACTION_DELETE_ROW) {
        /* PUT, or UPDATE without a before-image: {**key, **columns} */
        for (Py_ssize_t k = 0; k < pg->n_col; k++) {
            int32_t id = pg->col_ids[k];
            val_set(pg, stamp, id, &t->col_val[id]);
        }
    }
    for (Py_ssize_t j = 0; j < L; j++) {
        Column *col = &cols[j];
        int32_t id = col->id;
        r = t->val_stamp[id] == stamp ? put_value(col, i, &t->val_val[id]) : put_null(col, i);
        if (r != OK) return r;
    }

    /* _before and _extra: canonical JSON */
    if (w->has_before) {
        memcpy(pg->ids, pg->bef_ids, (size_t)pg->n_bef * sizeof(int32_t));
        if ((r = json_object(&c_before->data, t, pg->ids, pg->n_bef, t->bef_val)) != OK)
            return r;
        set_valid(c_before, i);
        if ((r = close_string(c_before, i)) != OK) return r;
    } else if ((r = put_null(c_before, i)) != OK) {
        return r;
    }
    Py_ssize_t n_extra = 0;
    for (Py_ssize_t k = 0; k < pg->n_val; k++)
        if (!t->names[pg->val_ids[k]].in_layout) pg->ids[n_extra++] = pg->val_ids[k];
    if (n_extra) {
        if ((r = json_object(&c_extra->data, t, pg->ids, n_extra, t->val_val)) != OK) return r;
        set_valid(c_extra, i);
        r = close_string(c_extra, i);
    } else {
        r = put_null(c_extra, i);
    }

    return r;
}

/* The parts of a protobuf ``Record`` (``record`` and ``origin_record`` are held in
 * ``*keep_record`` / ``*keep_origin`` while the spans point into them). FALLBACK for anything
 * but the message the protobuf runtime gives. */
static int record_parts(Page *pg, PyObject *wire, Parts *w, PyObject **keep_record,
                        PyObject **keep_origin) {
    PyObject *action_obj = PyObject_GetAttr(wire, S_action_type);
    if (action_obj == NULL || !PyLong_CheckExact(action_obj)) {
        Py_XDECREF(action_obj);
        PyErr_Clear();
        return FALLBACK;
    }
    w->action = PyLong_AsLong(action_obj);
    Py_DECREF(action_obj);
    if (w->action == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return FALLBACK;
    }
    PyObject *record = *keep_record = PyObject_GetAttr(wire, S_record);
    PyObject *origin = *keep_origin = PyObject_GetAttr(wire, S_origin_record);
    if (record == NULL || !PyBytes_CheckExact(record) || origin == NULL ||
        !PyBytes_CheckExact(origin)) {
        PyErr_Clear();
        return FALLBACK;
    }
    w->record = (const uint8_t *)PyBytes_AS_STRING(record);
    w->record_len = PyBytes_GET_SIZE(record);
    w->origin = (const uint8_t *)PyBytes_AS_STRING(origin);
    w->origin_len = PyBytes_GET_SIZE(origin);
    if (w->origin_len > 0) {
        w->has_before = 1; /* a set bytes field; an unset one reads b"" */
        return OK;
    }
    PyObject *has = has_field(pg, wire);
    if (has == NULL) {
        PyErr_Clear();
        return FALLBACK;
    }
    w->has_before = PyObject_IsTrue(has);
    Py_DECREF(has);
    if (w->has_before < 0) {
        PyErr_Clear();
        return FALLBACK;
    }
    return OK;
}

static int decode_wire_record(Page *pg, Py_ssize_t i, PyObject *wire, int has_base,
                              int64_t base_offset, Py_ssize_t *with_seq) {
    Parts w;
    PyObject *record = NULL, *origin = NULL;
    int r = record_parts(pg, wire, &w, &record, &origin);
    if (r == OK) r = decode_record(pg, i, &w, has_base, base_offset, with_seq);
    Py_XDECREF(record);
    Py_XDECREF(origin);
    return r;
}

/* _decode_all's page checks: no mix of stream and base records; stream sequences increase. */
static int page_checks(Page *pg, Py_ssize_t n, Py_ssize_t with_seq) {
    if (with_seq > 0 && with_seq < n) {
        pg->reason = PyUnicode_FromString("a page mixes records with and without sequence info");
        return pg->reason == NULL ? FAILED : MALFORMED;
    }
    if (!with_seq) return OK;
    Column *c_seq = &pg->cols[pg->ncols + 1];
    const int32_t *off = (const int32_t *)c_seq->fixed;
    const char *s = (const char *)c_seq->data.p;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        /* every stream sequence is 34 characters of the same shape: byte order is the order */
        if (memcmp(s + off[i], s + off[i + 1], 34) >= 0) {
            char a[35], b[35];
            memcpy(a, s + off[i], 34);
            memcpy(b, s + off[i + 1], 34);
            a[34] = b[34] = 0;
            pg->reason = PyUnicode_FromFormat(
                "sequences do not increase within the page (%s then %s)", a, b);
            return pg->reason == NULL ? FAILED : MALFORMED;
        }
    }
    return OK;
}

/* Where a page's records come from: protobuf ``Record`` objects, or the spans
 * ``scan_read_records`` indexed in a response's bytes (RAW_FIELDS int32 per record). */
#define RAW_FIELDS 5 /* action, record offset, record length, origin offset (-1: unset), length */
typedef struct {
    PyObject *seq; /* PySequence_Fast of Record objects, or NULL */
    const uint8_t *body;
    const int32_t *index;
} Source;

static int source_record(Page *pg, const Source *src, Py_ssize_t i, int has_base,
                         int64_t base_offset, Py_ssize_t *with_seq) {
    if (src->seq != NULL)
        return decode_wire_record(pg, i, PySequence_Fast_GET_ITEM(src->seq, i), has_base,
                                  base_offset, with_seq);
    const int32_t *f = src->index + i * RAW_FIELDS;
    Parts w = {f[0], src->body + f[1], f[2], f[3] >= 0, NULL, 0};
    if (w.has_before) {
        w.origin = src->body + f[3];
        w.origin_len = f[4];
    }
    return decode_record(pg, i, &w, has_base, base_offset, with_seq);
}

/* base_offset (None or an int) -> *has_base, *base_offset; 0 when the Python path must decode
 * (not an int64), -1 with an exception set. */
static int parse_base(PyObject *base_obj, int *has_base, int64_t *base_offset) {
    *has_base = base_obj != Py_None;
    *base_offset = 0;
    if (!*has_base) return 1;
    if (!PyLong_Check(base_obj)) return 0;
    int overflow;
    *base_offset = PyLong_AsLongLongAndOverflow(base_obj, &overflow);
    if (overflow) return 0;
    if (*base_offset == -1 && PyErr_Occurred()) return -1;
    return 1;
}

/* The page of ``n`` records of ``src``: (n, columns) | reason | None, as decode_page. */
static PyObject *decode_source(const Source *src, Py_ssize_t n, PyObject *layout_names,
                               const char *kinds, Py_ssize_t nkinds, int has_base,
                               int64_t base_offset) {
    Py_ssize_t L = PyTuple_GET_SIZE(layout_names);
    if (nkinds != L) {
        PyErr_SetString(PyExc_ValueError, "one kind per layout column");
        return NULL;
    }
    if (n >= UINT32_MAX - 1) Py_RETURN_NONE;

    Page pg;
    memset(&pg, 0, sizeof(pg));
    pg.ncols = L;
    PyObject *result = NULL;
    int r = OK;
    Py_ssize_t ncolumns = L + 5;
    pg.cols = PyMem_Calloc((size_t)ncolumns, sizeof(Column));
    if (pg.cols == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t j = 0; j < L; j++) {
        PyObject *name = PyTuple_GET_ITEM(layout_names, j);
        int kind = (unsigned char)kinds[j];
        if (!PyBytes_Check(name) || kind > KIND_BINARY) {
            PyErr_SetString(PyExc_TypeError, "layout names are bytes, kinds 0..4");
            goto out;
        }
        if (column_init(&pg.cols[j], kind, n) != OK) goto out;
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(name);
        uint32_t len = (uint32_t)PyBytes_GET_SIZE(name);
        uint32_t hash = name_hash(p, len);
        int32_t id = names_find(&pg.names, p, len, hash);
        if (id < 0 && names_add(&pg.names, p, len, hash, &id) != OK) goto out;
        pg.names.names[id].in_layout = 1;
        pg.cols[j].id = id;
    }
    static const int META_KINDS[] = {KIND_STRING, KIND_STRING, KIND_INT64, KIND_STRING,
                                     KIND_STRING};
    for (int j = 0; j < 5; j++)
        if (column_init(&pg.cols[L + j], META_KINDS[j], n) != OK) goto out;

    Py_ssize_t with_seq = 0;
    for (Py_ssize_t i = 0; i < n && r == OK; i++)
        r = source_record(&pg, src, i, has_base, base_offset, &with_seq);
    if (r == OK) r = page_checks(&pg, n, with_seq);
    if (r == FAILED) goto out;
    if (r == FALLBACK) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    if (r == MALFORMED) {
        result = pg.reason;
        pg.reason = NULL;
        goto out;
    }
    PyObject *columns = PyTuple_New(ncolumns);
    if (columns == NULL) goto out;
    for (Py_ssize_t j = 0; j < ncolumns; j++) {
        PyObject *col = column_out(&pg.cols[j], n);
        if (col == NULL) {
            Py_DECREF(columns);
            goto out;
        }
        PyTuple_SET_ITEM(columns, j, col);
    }
    result = Py_BuildValue("(nN)", n, columns);

out:
    Py_XDECREF(pg.reason);
    Py_XDECREF(pg.has_field);
    if (pg.cols != NULL) {
        for (Py_ssize_t j = 0; j < ncolumns; j++) column_free(&pg.cols[j]);
        PyMem_Free(pg.cols);
    }
    names_free(&pg.names);
    PyMem_Free(pg.row.pk.cells);
    PyMem_Free(pg.row.data.cells);
    PyMem_Free(pg.origin.pk.cells);
    PyMem_Free(pg.origin.data.cells);
    PyMem_Free(pg.ids);
    PyMem_Free(pg.col_ids);
    PyMem_Free(pg.bef_ids);
    PyMem_Free(pg.val_ids);
    return result;
}

static PyObject *decode_page(PyObject *self, PyObject *args) {
    PyObject *records, *layout_names, *base_obj;
    const char *kinds;
    Py_ssize_t nkinds;
    if (!PyArg_ParseTuple(args, "OO!y#O", &records, &PyTuple_Type, &layout_names, &kinds,
                          &nkinds, &base_obj))
        return NULL;
    int has_base;
    int64_t base_offset;
    int ok = parse_base(base_obj, &has_base, &base_offset);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
    Source src = {PySequence_Fast(records, "records must be a sequence"), NULL, NULL};
    if (src.seq == NULL) return NULL;
    PyObject *result = decode_source(&src, PySequence_Fast_GET_SIZE(src.seq), layout_names,
                                     kinds, nkinds, has_base, base_offset);
    Py_DECREF(src.seq);
    return result;
}

static PyObject *decode_raw_page(PyObject *self, PyObject *args) {
    Py_buffer body, index;
    Py_ssize_t start, stop;
    PyObject *layout_names, *base_obj;
    const char *kinds;
    Py_ssize_t nkinds;
    if (!PyArg_ParseTuple(args, "y*y*nnO!y#O", &body, &index, &start, &stop, &PyTuple_Type,
                          &layout_names, &kinds, &nkinds, &base_obj))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = index.len / (Py_ssize_t)(RAW_FIELDS * sizeof(int32_t));
    if (index.len % (Py_ssize_t)(RAW_FIELDS * sizeof(int32_t)) || start < 0 || start > stop ||
        stop > count) {
        PyErr_SetString(PyExc_ValueError, "start and stop must lie within the index");
        goto out;
    }
    int has_base;
    int64_t base_offset;
    int ok = parse_base(base_obj, &has_base, &base_offset);
    if (ok <= 0) {
        if (ok == 0) result = Py_NewRef(Py_None);
        goto out;
    }
    /* scan_read_records made the index of this body; checked all the same, so no call can
     * make the decoder read outside the body */
    const int32_t *fields = (const int32_t *)index.buf;
    for (Py_ssize_t i = start * RAW_FIELDS; i < stop * RAW_FIELDS; i += RAW_FIELDS) {
        const int32_t *f = fields + i;
        if (f[1] < 0 || f[2] < 0 || f[1] > body.len - f[2] ||
            (f[3] >= 0 && (f[4] < 0 || f[3] > body.len - f[4]))) {
            PyErr_SetString(PyExc_ValueError, "the index does not describe this body");
            goto out;
        }
    }
    Source src = {NULL, (const uint8_t *)body.buf, fields + start * RAW_FIELDS};
    result = decode_source(&src, stop - start, layout_names, kinds, nkinds, has_base,
                           base_offset);
out:
    PyBuffer_Release(&body);
    PyBuffer_Release(&index);
    return result;
}

/* --- a ReadRecordsResponse's bytes, scanned ------------------------------------------------ */

/* A varint at *pos (at most 10 bytes); 0 when truncated or too long. */
static inline int pb_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= end) return 0;
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* A field's tag at *pos: its number (1 .. 2^29-1, as protobuf allows) and wire type. */
static inline int pb_tag(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, uint32_t *field,
                         int *wire_type) {
    uint64_t tag;
    if (!pb_varint(p, end, pos, &tag) || tag > 0xFFFFFFFFu) return 0;
    *field = (uint32_t)(tag >> 3);
    *wire_type = (int)(tag & 7);
    return *field >= 1 && *field <= 0x1FFFFFFF;
}

/* A length-delimited field's value at *pos: [*at, *at + *len) within end. */
static inline int pb_span(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t *at,
                          Py_ssize_t *len) {
    uint64_t n;
    if (!pb_varint(p, end, pos, &n) || n > (uint64_t)(end - *pos)) return 0;
    *at = *pos;
    *len = (Py_ssize_t)n;
    *pos += (Py_ssize_t)n;
    return 1;
}

/* Skip an unknown field's value (groups, which no Tunnel message has, are not skipped). */
static int pb_skip(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int wire_type) {
    uint64_t v;
    Py_ssize_t at, len;
    switch (wire_type) {
        case 0: return pb_varint(p, end, pos, &v);
        case 1:
            if (end - *pos < 8) return 0;
            *pos += 8;
            return 1;
        case 2: return pb_span(p, end, pos, &at, &len);
        case 5:
            if (end - *pos < 4) return 0;
            *pos += 4;
            return 1;
        default: return 0;
    }
}

/* One Record message at [pos, end): its RAW_FIELDS; 0 unless it is a complete Record with an
 * action the decoder knows (anything else: the protobuf runtime decides). */
static int scan_record(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, int32_t *f) {
    int has_action = 0, has_record = 0;
    f[3] = -1;
    f[4] = 0;
    while (pos < end) {
        uint32_t field;
        int wt;
        uint64_t v;
        Py_ssize_t at, len;
        if (!pb_tag(p, end, &pos, &field, &wt)) return 0;
        if (field == 1) { /* action_type */
            if (wt != 0 || !pb_varint(p, end, &pos, &v)) return 0;
            if (v != ACTION_PUT_ROW && v != ACTION_UPDATE_ROW && v != ACTION_DELETE_ROW)
                return 0;
            f[0] = (int32_t)v;
            has_action = 1;
        } else if (field == 2 || field == 3) { /* record, origin_record: the last one counts */
            if (wt != 2 || !pb_span(p, end, &pos, &at, &len)) return 0;
            f[field == 2 ? 1 : 3] = (int32_t)at;
            f[field == 2 ? 2 : 4] = (int32_t)len;
            has_record |= field == 2;
        } else if (!pb_skip(p, end, &pos, wt)) {
            return 0;
        }
    }
    return has_action && has_record;
}

static PyObject *scan_read_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t end = view.len, pos = 0, token_at = -1, token_len = 0;
    int may_more = -1, ok = end <= INT32_MAX;
    Buf index = {NULL, 0, 0};
    PyObject *result = NULL;
    while (ok && pos < end) {
        uint32_t field;
        int wt;
        uint64_t v = 0;
        Py_ssize_t at, len;
        if (!pb_tag(p, end, &pos, &field, &wt)) {
            ok = 0;
        } else if (field == 1) { /* records */
            int32_t f[RAW_FIELDS];
            ok = wt == 2 && pb_span(p, end, &pos, &at, &len) && scan_record(p, at, at + len, f);
            if (ok && buf_put(&index, f, sizeof(f)) != OK) goto out;
        } else if (field == 2) { /* next_token */
            ok = wt == 2 && pb_span(p, end, &pos, &token_at, &token_len);
        } else if (field == 3) { /* may_more_record */
            ok = wt == 0 && pb_varint(p, end, &pos, &v);
            may_more = v != 0;
        } else {
            ok = pb_skip(p, end, &pos, wt);
        }
    }
    if (!ok || token_at < 0 || !utf8_valid(p + token_at, token_len)) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    Py_ssize_t count = index.len / (Py_ssize_t)(RAW_FIELDS * sizeof(int32_t));
    result = Py_BuildValue("(ns#iy#)", count, (const char *)p + token_at, token_len, may_more,
                           index.p != NULL ? (const char *)index.p : "", index.len);
out:
    buf_free(&index);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef METHODS[] = {
    {"decode_page", decode_page, METH_VARARGS,
     "decode_page(records, names, kinds, base_offset) -> (n, columns) | reason | None\n\n"
     "One ReadRecords page's wire Records into the buffers of the page's Arrow columns "
     "(see connector/tunnel/tablestore/columnar.py)."},
    {"decode_raw_page", decode_raw_page, METH_VARARGS,
     "decode_raw_page(body, index, start, stop, names, kinds, base_offset) -> as decode_page\n\n"
     "Records start..stop of a ReadRecords response's bytes, as scan_read_records indexed "
     "them, into the buffers of the page's Arrow columns."},
    {"scan_read_records", scan_read_records, METH_VARARGS,
     "scan_read_records(body) -> (count, next_token, may_more, index) | None\n\n"
     "A ReadRecordsResponse's bytes: its record count, next_token, may_more_record (-1 when "
     "unset) and the index of every record's fields; None unless it is a well-formed "
     "response the decoder reads (the protobuf runtime decides the rest)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_columnar",
    "The compiled PlainBuffer page decoder (connector.tunnel.tablestore.columnar).", -1, METHODS,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columnar(void) {
    crc8_init();
    S_action_type = PyUnicode_InternFromString("action_type");
    S_record = PyUnicode_InternFromString("record");
    S_origin_record = PyUnicode_InternFromString("origin_record");
    S_HasField = PyUnicode_InternFromString("HasField");
    if (!S_action_type || !S_record || !S_origin_record || !S_HasField) return NULL;
    return PyModule_Create(&MODULE);
}
