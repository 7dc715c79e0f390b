/* Ingest's per-span work on serialized OTLP, in C.
 *
 * Why: the receiver has to visit every span of an export call to group the spans by trace,
 * check their ids and times, find their request ids and frame them as chunk records. Parsing
 * the call into protobuf objects and visiting them in Python cost several times the database
 * insert. Here the bytes are read once, checked as the protobuf library would check them, and
 * no Python object is made per span.
 *
 * Everything here is a fast path with an exact fallback: whenever the bytes are not in the
 * plain shape this code expects (a singular field repeated, an unexpected wire type, bad
 * UTF-8, deep nesting, counts that disagree with the bytes), `scopes` or `chunk_spans` returns
 * None and the caller takes the Python path: the protobuf library parses the call (and rejects
 * a malformed one) and the rows are built from the parsed message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- wire format */

static int
read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        uint8_t b = *p++;
        if (shift == 63 && b > 1)
            return -1; /* more than 64 bits: leave it to the protobuf library */
        value |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = value;
            return 0;
        }
    }
    return -1;
}

static uint64_t
load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

typedef struct {
    int number;
    int wire;
    const uint8_t *start; /* length-delimited: the value's bytes */
    const uint8_t *stop;
    uint64_t scalar; /* varint or fixed64 */
} field;

/* Reads the field at *pp. Returns 0, or -1 when the framing is not one this code reads. */
static int
next_field(const uint8_t **pp, const uint8_t *end, field *f)
{
    uint64_t tag, n;
    const uint8_t *p = *pp;
    if (read_varint(&p, end, &tag) < 0)
        return -1;
    f->number = (int)(tag >> 3);
    f->wire = (int)(tag & 7);
    if (f->number == 0 || (tag >> 3) > 0x1FFFFFFF)
        return -1;
    switch (f->wire) {
    case 0:
        if (read_varint(&p, end, &f->scalar) < 0)
            return -1;
        break;
    case 1:
        if (end - p < 8)
            return -1;
        f->scalar = load_le64(p);
        p += 8;
        break;
    case 2:
        if (read_varint(&p, end, &n) < 0 || n > (uint64_t)(end - p))
            return -1;
        f->start = p;
        f->stop = p + n;
        p += n;
        break;
    case 5:
        if (end - p < 4)
            return -1;
        p += 4;
        break;
    default: /* groups: never in OTLP */
        return -1;
    }
    *pp = p;
    return 0;
}

/* ---------------------------------------------------------------- validation */

/* Whether a string field holds UTF-8 as the protobuf library requires of proto3 strings: no
 * overlong forms, no surrogates, nothing above U+10FFFF. */
static int
utf8_ok(const uint8_t *p, const uint8_t *end)
{
    while (p < end) {
        while (end - p >= 8) { /* ASCII runs, eight bytes at a time */
            uint64_t w;
            memcpy(&w, p, 8);
            if (w & 0x8080808080808080ULL)
                break;
            p += 8;
        }
        if (p >= end)
            break;
        uint8_t c = p[0];
        if (c < 0x80) {
            p += 1;
        }
        else if (c >= 0xC2 && c <= 0xDF) {
            if (end - p < 2 || (p[1] & 0xC0) != 0x80)
                return 0;
            p += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F))
                return 0; /* overlong, surrogate */
            p += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))
                return 0; /* overlong, above U+10FFFF */
            p += 4;
        }
        else
            return 0;
    }
    return 1;
}

/* The OTLP span schema, as far as checking it needs: each known field's wire shape, indexed
 * by field number (F_NONE: not a field of that message). */
typedef enum { F_NONE, F_BYTES, F_STRING, F_VARINT, F_FIXED64, F_FIXED32, F_MESSAGE } field_kind;
typedef struct message_def message_def;
typedef struct {
    field_kind kind;
    const message_def *message;
} field_def;
struct message_def {
    const field_def *fields;
    int count; /* highest field number + 1 */
};

extern const message_def ANY_VALUE;
static const field_def KEY_VALUE_FIELDS[] = {[1] = {F_STRING, NULL}, [2] = {F_MESSAGE, &ANY_VALUE}};
static const message_def KEY_VALUE = {KEY_VALUE_FIELDS, 3};
static const field_def ARRAY_VALUE_FIELDS[] = {[1] = {F_MESSAGE, &ANY_VALUE}};
static const message_def ARRAY_VALUE = {ARRAY_VALUE_FIELDS, 2};
static const field_def KV_LIST_FIELDS[] = {[1] = {F_MESSAGE, &KEY_VALUE}};
static const message_def KV_LIST = {KV_LIST_FIELDS, 2};
static const field_def ANY_VALUE_FIELDS[] = {
    [1] = {F_STRING, NULL},          [2] = {F_VARINT, NULL},       [3] = {F_VARINT, NULL},
    [4] = {F_FIXED64, NULL},         [5] = {F_MESSAGE, &ARRAY_VALUE}, [6] = {F_MESSAGE, &KV_LIST},
    [7] = {F_BYTES, NULL},
};
const message_def ANY_VALUE = {ANY_VALUE_FIELDS, 8};
static const field_def EVENT_FIELDS[] = {
    [1] = {F_FIXED64, NULL}, [2] = {F_STRING, NULL}, [3] = {F_MESSAGE, &KEY_VALUE}, [4] = {F_VARINT, NULL}};
static const message_def EVENT = {EVENT_FIELDS, 5};
static const field_def LINK_FIELDS[] = {
    [1] = {F_BYTES, NULL},  [2] = {F_BYTES, NULL},  [3] = {F_STRING, NULL},
    [4] = {F_MESSAGE, &KEY_VALUE}, [5] = {F_VARINT, NULL}, [6] = {F_FIXED32, NULL}};
static const message_def LINK = {LINK_FIELDS, 7};
static const field_def STATUS_FIELDS[] = {[2] = {F_STRING, NULL}, [3] = {F_VARINT, NULL}};
static const message_def STATUS = {STATUS_FIELDS, 4};
static const field_def SPAN_FIELDS[] = {
    [1] = {F_BYTES, NULL},          [2] = {F_BYTES, NULL},   [3] = {F_STRING, NULL},
    [4] = {F_BYTES, NULL},          [5] = {F_STRING, NULL},  [6] = {F_VARINT, NULL},
    [7] = {F_FIXED64, NULL},        [8] = {F_FIXED64, NULL}, [9] = {F_MESSAGE, &KEY_VALUE},
    [10] = {F_VARINT, NULL},        [11] = {F_MESSAGE, &EVENT}, [12] = {F_VARINT, NULL},
    [13] = {F_MESSAGE, &LINK},      [14] = {F_VARINT, NULL}, [15] = {F_MESSAGE, &STATUS},
    [16] = {F_FIXED32, NULL},
};
static const message_def SPAN = {SPAN_FIELDS, 17};

/* Nesting the check follows (a span sits at depth 4 of an export call); deeper values are
 * left to the protobuf library, whose own limit is 100. */
#define MAX_CHECK_DEPTH 64

/* Whether the protobuf library would parse these bytes as message `m`: 0 yes, -1 not sure.
 * Stricter than the library where that is simpler (a known field with another wire type is
 * an unknown field to it; here it is "not sure"), never more lenient. */
static int
check_message(const uint8_t *p, const uint8_t *end, const message_def *m, int depth)
{
    if (depth > MAX_CHECK_DEPTH)
        return -1;
    field f;
    while (p < end) {
        if (next_field(&p, end, &f) < 0)
            return -1;
        const field_def *d = f.number < m->count ? &m->fields[f.number] : NULL;
        if (!d || d->kind == F_NONE)
            continue; /* an unknown field, validly framed */
        switch (d->kind) {
        case F_NONE:
            break;
        case F_BYTES:
            if (f.wire != 2)
                return -1;
            break;
        case F_STRING:
            if (f.wire != 2 || !utf8_ok(f.start, f.stop))
                return -1;
            break;
        case F_VARINT:
            if (f.wire != 0)
                return -1;
            break;
        case F_FIXED64:
            if (f.wire != 1)
                return -1;
            break;
        case F_FIXED32:
            if (f.wire != 5)
                return -1;
            break;
        case F_MESSAGE:
            if (f.wire != 2 || check_message(f.start, f.stop, d->message, depth + 1) < 0)
                return -1;
            break;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- finder */

/* Several needles found in one pass over a buffer (Wu-Manber with two-byte blocks), where one
 * substring search per needle reads the buffer once per needle. A window as long as the
 * shortest needle slides along; the two bytes at its end say how far it may skip before any
 * needle's start could be inside it, and only windows they do not skip are compared. */
typedef struct {
    const uint8_t **needles;
    const Py_ssize_t *lens;
    Py_ssize_t count;
    Py_ssize_t m;   /* the shortest needle's length */
    uint8_t *shift; /* by the window's last two bytes; NULL when m < 2 */
} finder;

/* Returns 0, or -1 with MemoryError set. Needles must be non-empty and outlive the finder. */
static int
finder_init(finder *f, const uint8_t **needles, const Py_ssize_t *lens, Py_ssize_t count)
{
    f->needles = needles;
    f->lens = lens;
    f->count = count;
    f->shift = NULL;
    f->m = PY_SSIZE_T_MAX;
    for (Py_ssize_t j = 0; j < count; j++)
        if (lens[j] < f->m)
            f->m = lens[j];
    if (count == 0 || f->m < 2)
        return 0;
    if (!(f->shift = PyMem_Malloc(65536))) {
        PyErr_NoMemory();
        return -1;
    }
    memset(f->shift, (int)(f->m - 1 > 255 ? 255 : f->m - 1), 65536);
    for (Py_ssize_t j = 0; j < count; j++) {
        for (Py_ssize_t q = 1; q < f->m; q++) {
            unsigned block = (unsigned)needles[j][q - 1] << 8 | needles[j][q];
            Py_ssize_t skip = f->m - 1 - q;
            if (skip < f->shift[block])
                f->shift[block] = (uint8_t)skip;
        }
    }
    return 0;
}

static void
finder_free(finder *f)
{
    PyMem_Free(f->shift);
    f->shift = NULL;
}

/* Sets first[j] to where needle j first occurs in hay, or -1; returns how many occur. With
 * `any`, stops at the first occurrence of any needle (the other entries may then be -1). */
static Py_ssize_t
finder_first(const finder *f, const uint8_t *hay, Py_ssize_t n, Py_ssize_t *first, int any)
{
    Py_ssize_t found = 0;
    for (Py_ssize_t j = 0; j < f->count; j++)
        first[j] = -1;
    if (f->count == 0 || f->m > n)
        return 0;
    if (!f->shift) {
        for (Py_ssize_t j = 0; j < f->count; j++) {
            const uint8_t *at = memmem(hay, (size_t)n, f->needles[j], (size_t)f->lens[j]);
            if (at) {
                first[j] = at - hay;
                found++;
                if (any)
                    break;
            }
        }
        return found;
    }
    Py_ssize_t m = f->m;
    for (Py_ssize_t pos = m - 1; pos < n;) {
        uint8_t skip = f->shift[(unsigned)hay[pos - 1] << 8 | hay[pos]];
        if (skip) {
            pos += skip;
            continue;
        }
        Py_ssize_t start = pos - (m - 1);
        for (Py_ssize_t j = 0; j < f->count; j++) {
            if (first[j] < 0 && f->lens[j] <= n - start &&
                memcmp(hay + start, f->needles[j], (size_t)f->lens[j]) == 0) {
                first[j] = start;
                found++;
                if (any || found == f->count)
                    return found;
            }
        }
        pos += 1;
    }
    return found;
}

/* ---------------------------------------------------------------- contains_any */

static PyObject *
contains_any(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer hay;
    PyObject *needles;
    if (!PyArg_ParseTuple(args, "y*O!:contains_any", &hay, &PyTuple_Type, &needles))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(needles);
    const uint8_t **ptrs = PyMem_Malloc(sizeof(*ptrs) * (size_t)(count + 1));
    Py_ssize_t *lens = PyMem_Malloc(sizeof(*lens) * (size_t)(count + 1));
    PyObject *result = NULL;
    if (!ptrs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *item = PyTuple_GET_ITEM(needles, j);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "contains_any: needles must be bytes");
            goto done;
        }
        ptrs[j] = (const uint8_t *)PyBytes_AS_STRING(item);
        lens[j] = PyBytes_GET_SIZE(item);
    }
    Py_ssize_t empty = 0;
    for (Py_ssize_t j = 0; j < count; j++)
        empty |= lens[j] == 0;
    if (empty) { /* as Python's `b"" in buffer` */
        result = Py_NewRef(Py_True);
        goto done;
    }
    finder f;
    if (finder_init(&f, ptrs, lens, count) < 0)
        goto done;
    Py_ssize_t *first = PyMem_Malloc(sizeof(*first) * (size_t)(count + 1));
    if (!first) {
        finder_free(&f);
        PyErr_NoMemory();
        goto done;
    }
    result = PyBool_FromLong(finder_first(&f, hay.buf, hay.len, first, 1) > 0);
    PyMem_Free(first);
    finder_free(&f);
done:
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    PyBuffer_Release(&hay);
    return result;
}

/* ---------------------------------------------------------------- chunk_spans */

/* The span fields ingest reads: ids, parent, times. Absent fields stay empty or zero, as
 * protobuf's defaults are. */
typedef struct {
    const uint8_t *start, *stop; /* the span's own encoding */
    const uint8_t *tid, *sid, *parent;
    Py_ssize_t tid_len, sid_len, parent_len;
    uint64_t start_ns, end_ns;
} span_view;

static int
read_span(const uint8_t *p, const uint8_t *end, span_view *s)
{
    unsigned seen = 0;
    field f;
    while (p < end) {
        if (next_field(&p, end, &f) < 0)
            return -1;
        switch (f.number) {
        case 1:
        case 2:
        case 4:
            if (f.wire != 2)
                return -1;
            if (f.number == 1) {
                s->tid = f.start;
                s->tid_len = f.stop - f.start;
            }
            else if (f.number == 2) {
                s->sid = f.start;
                s->sid_len = f.stop - f.start;
            }
            else {
                s->parent = f.start;
                s->parent_len = f.stop - f.start;
            }
            break;
        case 7:
        case 8:
            if (f.wire != 1)
                return -1;
            if (f.number == 7)
                s->start_ns = f.scalar;
            else
                s->end_ns = f.scalar;
            break;
        default:
            continue;
        }
        /* A repeated singular field: protobuf keeps the last; leave such spans to it. */
        if (seen & (1u << f.number))
            return -1;
        seen |= 1u << f.number;
    }
    return 0;
}

static const uint8_t ZERO[16] = {0};

static int
span_valid(const span_view *s, uint64_t lo, uint64_t hi)
{
    return s->tid_len == 16 && s->sid_len == 8 && (s->parent_len == 0 || s->parent_len == 8) &&
           lo <= s->start_ns && s->start_ns <= s->end_ns && s->end_ns < hi && memcmp(s->tid, ZERO, 16) != 0 &&
           memcmp(s->sid, ZERO, 8) != 0;
}

/* Open-addressing map from bytes that live in the export call's buffer to an index. */
typedef struct {
    const uint8_t **keys; /* NULL = empty slot */
    Py_ssize_t *values;
    size_t mask;
} table;

static uint64_t
mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static int
table_init(table *t, Py_ssize_t entries)
{
    size_t cap = 16;
    while (cap < (size_t)entries * 2)
        cap <<= 1;
    t->keys = PyMem_Calloc(cap, sizeof(*t->keys));
    t->values = PyMem_Malloc(cap * sizeof(*t->values));
    t->mask = cap - 1;
    return (t->keys && t->values) ? 0 : -1;
}

static void
table_free(table *t)
{
    PyMem_Free(t->keys);
    PyMem_Free(t->values);
}

/* The slot of `key` (len bytes; len is fixed per table): its own, or the empty one to fill. */
static size_t
table_slot(const table *t, const uint8_t *key, size_t len, uint64_t hash)
{
    size_t i = (size_t)mix(hash) & t->mask;
    while (t->keys[i] && memcmp(t->keys[i], key, len) != 0)
        i = (i + 1) & t->mask;
    return i;
}

/* (trace id, span id) pairs seen in one call, both pointing into its buffer. */
typedef struct {
    struct {
        const uint8_t *tid, *sid;
    } *slots; /* tid NULL = empty slot */
    size_t mask;
} pair_set;

static int
pair_set_init(pair_set *t, Py_ssize_t entries)
{
    size_t cap = 16;
    while (cap < (size_t)entries * 2)
        cap <<= 1;
    t->slots = PyMem_Calloc(cap, sizeof(*t->slots));
    t->mask = cap - 1;
    return t->slots ? 0 : -1;
}

typedef struct {
    const uint8_t *tid;
    uint8_t *body;
    size_t len, cap;
    Py_ssize_t spans;
    int has_root;
} chunk;

static int
chunk_append(chunk *c, uint64_t rid, const uint8_t *enc, size_t n)
{
    size_t need = c->len + 12 + n;
    if (need > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < need)
            cap *= 2;
        uint8_t *grown = PyMem_Realloc(c->body, cap);
        if (!grown)
            return -1;
        c->body = grown;
        c->cap = cap;
    }
    uint8_t *out = c->body + c->len;
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(rid >> (56 - 8 * i));
    for (int i = 0; i < 4; i++)
        out[8 + i] = (uint8_t)((uint64_t)n >> (24 - 8 * i));
    memcpy(out + 12, enc, n);
    c->len = need;
    return 0;
}

/* The request-id value that follows a key needle and the value's tag 0x12 (`KeyValue{key,
 * value: AnyValue{...}}` in field order, as protobuf writes it): a
 * short string_value, or the first item of a short array_value. Returns 0 with the value's
 * bounds, or -1 when the value is not in that short shape (the caller then reads it the long
 * way). Mirrors `railtrace.otlp.rows._SHORT_STRING`. */
static int
short_value_after(const uint8_t *p, const uint8_t *end, const uint8_t **vstart, const uint8_t **vstop)
{
    if (p >= end || *p >= 0x80)
        return -1;
    const uint8_t *q = p + 1;
    const uint8_t *at = NULL;
    size_t n = 0;
    if (end - q >= 6 && q[0] == 0x2A && q[1] < 0x80 && q[2] == 0x0A && q[3] < 0x80 && q[4] == 0x0A &&
        q[5] < 0x80) {
        n = q[5];
        at = q + 6;
    }
    else if (end - q >= 2 && q[0] == 0x0A && q[1] < 0x80) {
        n = q[1];
        at = q + 2;
    }
    else
        return -1;
    *vstart = at;
    *vstop = (size_t)(end - at) < n ? end : at + n;
    return 0;
}

/* The short string_value written just before a key that starts at `key`, as the Collector's
 * pdata encodes a KeyValue (fields in descending order): `0x12 <n+2> 0x0A <n> value key`.
 * Returns 0 with the value's bounds, or -1 (the caller then reads it the long way). Mirrors
 * `railtrace.otlp.rows.value_before`. */
static int
short_value_before(const uint8_t *lo, const uint8_t *key, const uint8_t **vstart, const uint8_t **vstop)
{
    for (size_t n = 0; n < 126; n++) {
        const uint8_t *start = key - n;
        if (start - lo < 4)
            return -1;
        if (start[-1] == n && start[-2] == 0x0A && start[-3] == n + 2 && start[-4] == 0x12) {
            *vstart = start;
            *vstop = key;
            return 0;
        }
    }
    return -1;
}

typedef struct {
    uint64_t rid;
    Py_ssize_t spans;
} scope_info;

static int
parse_scopes(PyObject *seq, scope_info **out, Py_ssize_t *count, Py_ssize_t *total)
{
    PyObject *fast = PySequence_Fast(seq, "chunk_spans: scopes must be a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    scope_info *scopes = PyMem_Malloc(sizeof(*scopes) * (size_t)(n + 1));
    if (!scopes) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    *total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long rid;
        Py_ssize_t spans;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "Kn:scope", &rid, &spans) || spans < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "chunk_spans: a scope's span count is negative");
            PyMem_Free(scopes);
            Py_DECREF(fast);
            return -1;
        }
        scopes[i].rid = rid;
        scopes[i].spans = spans;
        *total += spans;
    }
    Py_DECREF(fast);
    *out = scopes;
    *count = n;
    return 0;
}

/* State of one chunk_spans call; everything it allocates is freed by state_free. */
typedef struct {
    scope_info *scopes;
    Py_ssize_t nscopes;
    const uint8_t **needles;
    Py_ssize_t *needle_lens;
    Py_ssize_t nneedles;
    finder keys;          /* finds the key needles */
    Py_ssize_t *first;    /* where each key needle first occurs in the current span */
    pair_set seen;
    table traces;
    chunk *chunks;
    Py_ssize_t nchunks;
    PyObject *candidates, *slow, *rejected;
} state;

static void
state_free(state *st)
{
    PyMem_Free(st->scopes);
    PyMem_Free(st->needles);
    PyMem_Free(st->needle_lens);
    finder_free(&st->keys);
    PyMem_Free(st->first);
    PyMem_Free(st->seen.slots);
    table_free(&st->traces);
    if (st->chunks)
        for (Py_ssize_t i = 0; i < st->nchunks; i++)
            PyMem_Free(st->chunks[i].body);
    PyMem_Free(st->chunks);
    Py_XDECREF(st->candidates);
    Py_XDECREF(st->slow);
    Py_XDECREF(st->rejected);
}

/* Status of one span: 0 handled, 1 framing this code does not read (fall back), -1 error set. */
static int
take_span(state *st, const uint8_t *p, const uint8_t *end, uint64_t rid, Py_ssize_t *valid, uint64_t lo,
          uint64_t hi)
{
    span_view s = {0};
    s.start = p;
    s.stop = end;
    if (check_message(p, end, &SPAN, 4) < 0)
        return 1;
    if (read_span(p, end, &s) < 0)
        return 1;
    if (!span_valid(&s, lo, hi)) {
        PyObject *enc = PyBytes_FromStringAndSize((const char *)p, end - p);
        if (!enc || PyList_Append(st->rejected, enc) < 0) {
            Py_XDECREF(enc);
            return -1;
        }
        Py_DECREF(enc);
        return 0;
    }
    /* The same span twice in one call: keep the first. */
    size_t i = (size_t)mix(load_le64(s.tid) ^ load_le64(s.tid + 8) * 0x9E3779B97F4A7C15ULL ^ load_le64(s.sid)) &
               st->seen.mask;
    for (; st->seen.slots[i].tid; i = (i + 1) & st->seen.mask)
        if (memcmp(st->seen.slots[i].tid, s.tid, 16) == 0 && memcmp(st->seen.slots[i].sid, s.sid, 8) == 0)
            return 0;
    st->seen.slots[i].tid = s.tid;
    st->seen.slots[i].sid = s.sid;
    *valid += 1;

    /* Its trace's chunk. */
    uint64_t th = load_le64(s.tid) ^ load_le64(s.tid + 8) * 0x9E3779B97F4A7C15ULL;
    size_t slot = table_slot(&st->traces, s.tid, 16, th);
    chunk *c;
    if (st->traces.keys[slot]) {
        c = &st->chunks[st->traces.values[slot]];
    }
    else {
        st->traces.keys[slot] = s.tid;
        st->traces.values[slot] = st->nchunks;
        c = &st->chunks[st->nchunks++];
        memset(c, 0, sizeof(*c));
        c->tid = s.tid;
    }
    if (chunk_append(c, rid, p, (size_t)(end - p)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    c->spans += 1;
    if (s.parent_len == 0)
        c->has_root = 1;

    /* Its request-id candidates, strongest key attribute first. */
    PyObject *cands = NULL;
    Py_ssize_t ncands = 0;
    if (finder_first(&st->keys, p, end - p, st->first, 0) == 0)
        return 0;
    for (Py_ssize_t j = 0; j < st->nneedles; j++) {
        if (st->first[j] < 0)
            continue;
        const uint8_t *vs, *ve;
        const uint8_t *key = p + st->first[j];
        const uint8_t *after = key + st->needle_lens[j];
        int found = after < end && *after == 0x12 ? short_value_after(after + 1, end, &vs, &ve)
                                                   : short_value_before(p, key, &vs, &ve);
        if (found < 0) {
            Py_XDECREF(cands);
            PyObject *item = Py_BuildValue("(y#y#)", s.tid, (Py_ssize_t)16, p, (Py_ssize_t)(end - p));
            if (!item || PyList_Append(st->slow, item) < 0) {
                Py_XDECREF(item);
                return -1;
            }
            Py_DECREF(item);
            return 0;
        }
        if (!cands && !(cands = PyTuple_New(st->nneedles)))
            return -1;
        PyObject *v = PyBytes_FromStringAndSize((const char *)vs, ve - vs);
        if (!v) {
            Py_DECREF(cands);
            return -1;
        }
        PyTuple_SET_ITEM(cands, ncands++, v);
    }
    if (cands) {
        if (ncands < st->nneedles && _PyTuple_Resize(&cands, ncands) < 0)
            return -1;
        PyObject *item = Py_BuildValue("(y#N)", s.tid, (Py_ssize_t)16, cands);
        if (!item || PyList_Append(st->candidates, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
    }
    return 0;
}

/* A field of ResourceSpans or ScopeSpans in the shape the protobuf library reads: field 1
 * (resource, scope) and 2 (scopes, spans) are messages, field 3 (schema_url) a UTF-8 string. */
static int
plain_outer_field(const field *f)
{
    if (f->number > 3)
        return 1;
    return f->wire == 2 && (f->number != 3 || utf8_ok(f->start, f->stop));
}

/* Status: 0 done, 1 fall back, -1 error set. */
static int
walk_call(state *st, const uint8_t *raw, Py_ssize_t n, Py_ssize_t *valid, uint64_t lo, uint64_t hi)
{
    const uint8_t *p = raw, *end = raw + n;
    Py_ssize_t scope = 0;
    int status = 0;
    field rs, ss, sp;
    while (status == 0 && p < end) {
        if (next_field(&p, end, &rs) < 0) {
            status = 1;
            break;
        }
        if (rs.number != 1)
            continue;
        if (rs.wire != 2) {
            status = 1;
            break;
        }
        const uint8_t *q = rs.start;
        while (status == 0 && q < rs.stop) {
            if (next_field(&q, rs.stop, &ss) < 0 || !plain_outer_field(&ss)) {
                status = 1;
                break;
            }
            if (ss.number != 2)
                continue;
            if (ss.wire != 2 || scope >= st->nscopes) {
                status = 1;
                break;
            }
            Py_ssize_t spans = 0;
            const uint8_t *r = ss.start;
            while (status == 0 && r < ss.stop) {
                if (next_field(&r, ss.stop, &sp) < 0 || !plain_outer_field(&sp)) {
                    status = 1;
                    break;
                }
                if (sp.number != 2)
                    continue;
                if (sp.wire != 2 || ++spans > st->scopes[scope].spans) {
                    status = 1;
                    break;
                }
                status = take_span(st, sp.start, sp.stop, st->scopes[scope].rid, valid, lo, hi);
            }
            if (status == 0 && spans != st->scopes[scope].spans)
                status = 1;
            scope++;
        }
    }
    if (status == 0 && scope != st->nscopes)
        status = 1;
    return status;
}

static PyObject *
chunk_spans(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer raw;
    PyObject *scopes_arg, *needles_arg;
    unsigned long long lo, hi;
    if (!PyArg_ParseTuple(args, "y*OO!KK:chunk_spans", &raw, &scopes_arg, &PyTuple_Type, &needles_arg, &lo, &hi))
        return NULL;
    state st;
    memset(&st, 0, sizeof(st));
    PyObject *result = NULL;
    Py_ssize_t total = 0, valid = 0;
    if (parse_scopes(scopes_arg, &st.scopes, &st.nscopes, &total) < 0)
        goto done;
    st.nneedles = PyTuple_GET_SIZE(needles_arg);
    st.needles = PyMem_Malloc(sizeof(*st.needles) * (size_t)(st.nneedles + 1));
    st.needle_lens = PyMem_Malloc(sizeof(*st.needle_lens) * (size_t)(st.nneedles + 1));
    if (!st.needles || !st.needle_lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < st.nneedles; j++) {
        PyObject *item = PyTuple_GET_ITEM(needles_arg, j);
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) == 0) {
            PyErr_SetString(PyExc_TypeError, "chunk_spans: needles must be non-empty bytes");
            goto done;
        }
        st.needles[j] = (const uint8_t *)PyBytes_AS_STRING(item);
        st.needle_lens[j] = PyBytes_GET_SIZE(item);
    }
    if (finder_init(&st.keys, st.needles, st.needle_lens, st.nneedles) < 0)
        goto done;
    if (!(st.first = PyMem_Malloc(sizeof(*st.first) * (size_t)(st.nneedles + 1))) ||
        pair_set_init(&st.seen, total) < 0 || table_init(&st.traces, total) < 0 ||
        !(st.chunks = PyMem_Malloc(sizeof(chunk) * (size_t)(total + 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(st.candidates = PyList_New(0)) || !(st.slow = PyList_New(0)) || !(st.rejected = PyList_New(0)))
        goto done;
    int status = walk_call(&st, raw.buf, raw.len, &valid, lo, hi);
    if (status < 0)
        goto done;
    if (status > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *chunks = PyList_New(st.nchunks);
    if (!chunks)
        goto done;
    for (Py_ssize_t i = 0; i < st.nchunks; i++) {
        chunk *c = &st.chunks[i];
        PyObject *item = Py_BuildValue("(y#y#nO)", c->tid, (Py_ssize_t)16, c->body, (Py_ssize_t)c->len, c->spans,
                                       c->has_root ? Py_True : Py_False);
        if (!item) {
            Py_DECREF(chunks);
            goto done;
        }
        PyList_SET_ITEM(chunks, i, item);
    }
    result = Py_BuildValue("(NOOOn)", chunks, st.candidates, st.slow, st.rejected, valid);
done:
    state_free(&st);
    PyBuffer_Release(&raw);
    return result;
}

/* The (resource, scope, span count) of each ScopeSpans of an export call, in order, or None
 * when its outer framing is not the plain one (a resource or scope field repeated, which the
 * protobuf library would merge; an unexpected wire type). */
static PyObject *
scopes(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer raw;
    if (!PyArg_ParseTuple(args, "y*:scopes", &raw))
        return NULL;
    PyObject *out = PyList_New(0), *result = NULL;
    const uint8_t *p = raw.buf, *end = p + raw.len;
    field rs, f, sp;
    int plain = 1;
    if (!out)
        goto done;
    while (plain && p < end) {
        if (next_field(&p, end, &rs) < 0 || (rs.number == 1 && rs.wire != 2)) {
            plain = 0;
            break;
        }
        if (rs.number != 1)
            continue;
        /* First the resource: it may come after its scopes. */
        const uint8_t *resource = rs.start, *resource_end = rs.start;
        int resources = 0;
        for (const uint8_t *q = rs.start; plain && q < rs.stop;) {
            if (next_field(&q, rs.stop, &f) < 0 || !plain_outer_field(&f))
                plain = 0;
            else if (f.number == 1) {
                plain = ++resources == 1;
                resource = f.start;
                resource_end = f.stop;
            }
        }
        /* A resource without scopes is parsed by nobody here: leave the call to the library,
         * which checks every message. */
        int scopes_here = 0;
        for (const uint8_t *q = rs.start; plain && q < rs.stop;) {
            next_field(&q, rs.stop, &f); /* framing checked above */
            if (f.number != 2)
                continue;
            scopes_here++;
            const uint8_t *scope = f.start, *scope_end = f.start;
            int scope_fields = 0;
            Py_ssize_t spans = 0;
            for (const uint8_t *r = f.start; plain && r < f.stop;) {
                if (next_field(&r, f.stop, &sp) < 0 || !plain_outer_field(&sp))
                    plain = 0;
                else if (sp.number == 1) {
                    plain = ++scope_fields == 1;
                    scope = sp.start;
                    scope_end = sp.stop;
                }
                else if (sp.number == 2)
                    spans++;
            }
            if (!plain)
                break;
            PyObject *item = Py_BuildValue("(y#y#n)", resource, (Py_ssize_t)(resource_end - resource), scope,
                                           (Py_ssize_t)(scope_end - scope), spans);
            if (!item || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
        if (resources && !scopes_here)
            plain = 0;
    }
    result = plain ? Py_NewRef(out) : Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&raw);
    return result;
}

static PyMethodDef methods[] = {
    {"scopes", scopes, METH_VARARGS,
     "scopes(raw) -> list[tuple[bytes, bytes, int]] | None\n\n"
     "(Resource encoding, InstrumentationScope encoding, span count) of each ScopeSpans of an\n"
     "export call, in order; None when the outer framing is not the plain one, or a resource has\n"
     "no scopes (nothing would parse and so check it)."},
    {"contains_any", contains_any, METH_VARARGS,
     "contains_any(buffer, needles: tuple[bytes, ...]) -> bool\n\n"
     "Whether the buffer holds any of the needles, in one pass."},
    {"chunk_spans", chunk_spans, METH_VARARGS,
     "chunk_spans(raw, scopes, key_needles, min_time_ns, max_time_ns) -> tuple | None\n\n"
     "The spans of a content-free export call grouped into chunk records, each span checked as\n"
     "the protobuf library would parse it (else None).\n"
     "`scopes`: (resource id, span count) of each ScopeSpans, in order. Returns (chunks,\n"
     "keys, slow, rejected, valid): chunks as (trace id, body, span count, has root) in order\n"
     "of first appearance; keys as (trace id, request-id candidates strongest first) per span;\n"
     "slow as (trace id, span encoding) for spans whose request id is not in the short shape;\n"
     "rejected span encodings; the count of valid distinct spans. None when the framing is not\n"
     "the plain one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wirescan", "Ingest's per-span work on serialized OTLP, in C.", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC
PyInit__wirescan(void)
{
    return PyModule_Create(&module);
}
