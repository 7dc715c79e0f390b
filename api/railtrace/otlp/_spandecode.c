/* One stored OTLP Span encoding straight to the plain Python values a `railtrace.model.Span`
 * holds, bounded exactly as `railtrace.otlp.rows.span_from_pb` bounds them.
 *
 * Why: the assembler reads every stored span back; parsing it with upb and then walking the
 * parsed message attribute by attribute in Python was about a third of assembly's CPU time.
 * Here the bytes are read once and only the result objects are created.
 *
 * Contract: `decode(encoding, drop)` returns either exactly what upb + `span_from_pb` would
 * give, or None when the encoding holds anything this reader does not mirror (a singular
 * message field twice, which protobuf merges; group or unknown wire types; a known field with
 * an unexpected wire type; bad UTF-8; non-canonical tags or lengths; very deep nesting;
 * truncation). The caller then takes the upb path, which gives the answer or the error.
 * Everything upb would parse and check (UTF-8 of every string field, framing of every nested
 * message, including links and values beyond the bounds) is checked here too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Bounds of railtrace.otlp.decode and railtrace.otlp.rows; exported as BOUNDS so that the
 * Python side refuses this module if they ever differ. */
#define MAX_ATTR_VALUE_CHARS 8192
#define MAX_ARRAY_ITEMS 1024
#define MAX_DEPTH 8
#define MAX_ATTRIBUTES 256
#define MAX_EVENTS 128
#define MAX_NAME 512
#define MAX_STATUS_MESSAGE 1024
#define MAX_EVENT_NAME 256
/* Message nesting handled here; upb's own limit is 100, deeper inputs go to upb. */
#define MAX_NESTING 48

#define OK 0
#define UNSUPPORTED 1 /* not mirrored here: the caller takes the upb path */
#define FAILED (-1)   /* a Python exception is set */

#define TRY(expr)               \
    do {                        \
        int rc_ = (expr);       \
        if (rc_ != OK) {        \
            return rc_;         \
        }                       \
    } while (0)

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Reader;

/* Wire types */
#define VARINT 0
#define I64 1
#define LEN 2
#define I32 5

static int
read_varint(Reader *r, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end) {
            return UNSUPPORTED;
        }
        uint8_t b = *r->p++;
        if (i == 9 && b > 1) {
            return UNSUPPORTED; /* bits beyond 64: leave to upb */
        }
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return OK;
        }
    }
    return UNSUPPORTED;
}

/* A varint in its shortest form, below 2**32: tags and lengths. */
static int
read_canonical32(Reader *r, uint32_t *out)
{
    if (r->p < r->end && !(*r->p & 0x80)) {
        *out = *r->p++;
        return OK;
    }
    const uint8_t *start = r->p;
    uint64_t v;
    TRY(read_varint(r, &v));
    if (v > UINT32_MAX || r->p[-1] == 0 || r->p - start > 5) {
        return UNSUPPORTED;
    }
    *out = (uint32_t)v;
    return OK;
}

static int
read_tag(Reader *r, uint32_t *field, int *wire)
{
    uint32_t tag;
    TRY(read_canonical32(r, &tag));
    *field = tag >> 3;
    *wire = (int)(tag & 7);
    return *field == 0 ? UNSUPPORTED : OK;
}

static int
read_len(Reader *r, Reader *sub)
{
    uint32_t n;
    TRY(read_canonical32(r, &n));
    if ((size_t)(r->end - r->p) < n) {
        return UNSUPPORTED;
    }
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return OK;
}

static int
read_fixed64(Reader *r, uint64_t *out)
{
    if (r->end - r->p < 8) {
        return UNSUPPORTED;
    }
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | r->p[i];
    }
    r->p += 8;
    *out = v;
    return OK;
}

static int
skip_field(Reader *r, int wire)
{
    uint64_t ignored;
    Reader sub;
    switch (wire) {
    case VARINT:
        return read_varint(r, &ignored);
    case I64:
        return read_fixed64(r, &ignored);
    case LEN:
        return read_len(r, &sub);
    case I32:
        if (r->end - r->p < 4) {
            return UNSUPPORTED;
        }
        r->p += 4;
        return OK;
    default: /* groups and invalid wire types */
        return UNSUPPORTED;
    }
}

/* Python's strict UTF-8 decoding rejects what upb's validation rejects (overlong forms,
 * surrogates, code points above U+10FFFF). */
static int
make_str(Reader s, Py_ssize_t limit, PyObject **out)
{
    PyObject *u = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, "strict");
    if (u == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return UNSUPPORTED;
        }
        return FAILED;
    }
    if (limit >= 0 && PyUnicode_GET_LENGTH(u) > limit) {
        PyObject *cut = PyUnicode_Substring(u, 0, limit);
        Py_DECREF(u);
        if (cut == NULL) {
            return FAILED;
        }
        u = cut;
    }
    *out = u;
    return OK;
}

/* Replace *slot with the (bounded) string, or only check it when slot is NULL. */
static int
set_str(Reader s, Py_ssize_t limit, PyObject **slot)
{
    if (slot == NULL) {
        for (const uint8_t *c = s.p; c < s.end; c++) {
            if (*c & 0x80) {
                PyObject *u = NULL;
                TRY(make_str(s, -1, &u));
                Py_DECREF(u);
                return OK;
            }
        }
        return OK;
    }
    PyObject *u = NULL;
    TRY(make_str(s, limit, &u));
    Py_XSETREF(*slot, u);
    return OK;
}

static PyObject *
hex_of(Reader s)
{
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = s.end - s.p;
    PyObject *out = PyUnicode_New(2 * n, 127);
    if (out == NULL) {
        return NULL;
    }
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        d[2 * i] = (Py_UCS1)digits[s.p[i] >> 4];
        d[2 * i + 1] = (Py_UCS1)digits[s.p[i] & 15];
    }
    return out;
}

/* base64.b64encode(value[:MAX_ATTR_VALUE_CHARS]).decode("ascii") */
static PyObject *
base64_of(Reader s)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    Py_ssize_t n = s.end - s.p;
    if (n > MAX_ATTR_VALUE_CHARS) {
        n = MAX_ATTR_VALUE_CHARS;
    }
    PyObject *out = PyUnicode_New(4 * ((n + 2) / 3), 127);
    if (out == NULL) {
        return NULL;
    }
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    const uint8_t *p = s.p;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *d++ = (Py_UCS1)alphabet[v >> 18];
        *d++ = (Py_UCS1)alphabet[(v >> 12) & 63];
        *d++ = (Py_UCS1)alphabet[(v >> 6) & 63];
        *d++ = (Py_UCS1)alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *d++ = (Py_UCS1)alphabet[v >> 18];
        *d++ = (Py_UCS1)alphabet[(v >> 12) & 63];
        *d++ = '=';
        *d++ = '=';
    }
    else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *d++ = (Py_UCS1)alphabet[v >> 18];
        *d++ = (Py_UCS1)alphabet[(v >> 12) & 63];
        *d++ = (Py_UCS1)alphabet[(v >> 6) & 63];
        *d++ = '=';
    }
    return out;
}

/* Attribute keys repeat across spans (a process sends the same names again and again): short
 * ASCII keys are kept, already hashed, in a small direct-mapped cache, which spares decoding
 * them and hashing them for the drop set and the dict. */
#define KEY_CACHE_SLOTS 512
#define KEY_CACHE_MAX_LEN 64
static PyObject *key_cache[KEY_CACHE_SLOTS];

/* A new reference to the key's str, or NULL with no exception set when the key is not one
 * the cache holds (empty, long or not ASCII: decode it instead). */
static PyObject *
cached_key(Reader s)
{
    size_t n = (size_t)(s.end - s.p);
    if (n == 0 || n > KEY_CACHE_MAX_LEN) {
        return NULL;
    }
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        if (s.p[i] & 0x80) {
            return NULL;
        }
        h = (h ^ s.p[i]) * 16777619u;
    }
    PyObject **slot = &key_cache[h % KEY_CACHE_SLOTS];
    PyObject *key = *slot;
    if (key != NULL && (size_t)PyUnicode_GET_LENGTH(key) == n &&
        memcmp(PyUnicode_1BYTE_DATA(key), s.p, n) == 0) {
        return Py_NewRef(key);
    }
    key = PyUnicode_New((Py_ssize_t)n, 127);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(key), s.p, n);
    if (PyObject_Hash(key) == -1) {
        PyErr_Clear();
    }
    Py_XSETREF(*slot, Py_NewRef(key));
    return key;
}

static int any_value(Reader r, int depth, int nest, PyObject **out);

/* A KeyValue: its last key (checked, and built when key != NULL; "" when absent) and its
 * value's bytes (*has_value 0 when absent). A second value field would be merged by
 * protobuf: not mirrored. */
static int
key_value(Reader r, int nest, PyObject **key, Reader *value, int *has_value)
{
    uint32_t field;
    int wire;
    *has_value = 0;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    while (r.p < r.end) {
        TRY(read_tag(&r, &field, &wire));
        if (field == 1) {
            Reader s;
            if (wire != LEN) {
                return UNSUPPORTED;
            }
            TRY(read_len(&r, &s));
            PyObject *cached = key != NULL ? cached_key(s) : NULL;
            if (cached != NULL) {
                Py_XSETREF(*key, cached);
            }
            else {
                TRY(set_str(s, -1, key));
            }
        }
        else if (field == 2) {
            if (wire != LEN || *has_value) {
                return UNSUPPORTED;
            }
            TRY(read_len(&r, value));
            *has_value = 1;
        }
        else if (field == 3) { /* key_strindex */
            uint64_t ignored;
            if (wire != VARINT) {
                return UNSUPPORTED;
            }
            TRY(read_varint(&r, &ignored));
        }
        else {
            TRY(skip_field(&r, wire));
        }
    }
    if (key != NULL && *key == NULL) {
        *key = PyUnicode_FromStringAndSize("", 0);
        if (*key == NULL) {
            return FAILED;
        }
    }
    return OK;
}

/* A KeyValue's value at `depth`: None when absent, as an unset AnyValue gives. */
static int
kv_value(Reader value, int has_value, int depth, int nest, PyObject **out)
{
    if (has_value) {
        return any_value(value, depth, nest, out);
    }
    if (out != NULL) {
        *out = Py_NewRef(Py_None);
    }
    return OK;
}

/* ArrayValue (list of the first MAX_ARRAY_ITEMS values when out != NULL) or KeyValueList
 * (dict of the first MAX_ATTRIBUTES pairs, later duplicates overwriting); every item is
 * checked either way. */
static int
container(Reader r, int is_list, int depth, int nest, PyObject **out)
{
    uint32_t field;
    int wire;
    Py_ssize_t index = 0;
    PyObject *result = NULL;
    int rc = OK;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    if (out != NULL) {
        result = is_list ? PyList_New(0) : PyDict_New();
        if (result == NULL) {
            return FAILED;
        }
    }
    while (r.p < r.end) {
        Reader item;
        rc = read_tag(&r, &field, &wire);
        if (rc != OK) {
            goto done;
        }
        if (field != 1) {
            rc = skip_field(&r, wire);
            if (rc != OK) {
                goto done;
            }
            continue;
        }
        if (wire != LEN) {
            rc = UNSUPPORTED;
            goto done;
        }
        rc = read_len(&r, &item);
        if (rc != OK) {
            goto done;
        }
        int build = result != NULL && index < (is_list ? MAX_ARRAY_ITEMS : MAX_ATTRIBUTES);
        index++;
        PyObject *value = NULL;
        if (is_list) {
            rc = any_value(item, depth + 1, nest + 1, build ? &value : NULL);
            if (rc == OK && build) {
                rc = PyList_Append(result, value) < 0 ? FAILED : OK;
            }
            Py_XDECREF(value);
        }
        else {
            PyObject *key = NULL;
            Reader v = {NULL, NULL};
            int has_value;
            rc = key_value(item, nest + 1, build ? &key : NULL, &v, &has_value);
            if (rc == OK) {
                rc = kv_value(v, has_value, depth + 1, nest + 2, build ? &value : NULL);
            }
            if (rc == OK && build) {
                rc = PyDict_SetItem(result, key, value) < 0 ? FAILED : OK;
            }
            Py_XDECREF(key);
            Py_XDECREF(value);
        }
        if (rc != OK) {
            goto done;
        }
    }
done:
    if (rc != OK) {
        Py_XDECREF(result);
        return rc;
    }
    if (out != NULL) {
        *out = result;
    }
    return OK;
}

/* One oneof member of an AnyValue, built (out != NULL) or only checked. */
static int
member(uint32_t field, Reader bytes, uint64_t number, int depth, int nest, PyObject **out)
{
    PyObject *v = NULL;
    switch (field) {
    case 1: /* string_value */
        if (out == NULL) {
            return set_str(bytes, -1, NULL);
        }
        TRY(make_str(bytes, MAX_ATTR_VALUE_CHARS, &v));
        break;
    case 5: /* array_value */
    case 6: /* kvlist_value */
        if (out == NULL || depth >= MAX_DEPTH) {
            TRY(container(bytes, field == 5, depth, nest + 1, NULL));
            if (out == NULL) {
                return OK;
            }
            v = Py_NewRef(Py_None);
        }
        else {
            TRY(container(bytes, field == 5, depth, nest + 1, &v));
        }
        break;
    default:
        if (out == NULL) {
            return OK;
        }
        if (field == 2) {
            v = PyBool_FromLong(number != 0);
        }
        else if (field == 3) {
            v = PyLong_FromLongLong((long long)(int64_t)number);
        }
        else if (field == 4) {
            double d;
            memcpy(&d, &number, sizeof d);
            v = PyFloat_FromDouble(d);
        }
        else if (field == 7) {
            v = base64_of(bytes);
        }
        else { /* string_value_strindex, or no value at all */
            v = Py_NewRef(Py_None);
        }
        if (v == NULL) {
            return FAILED;
        }
    }
    *out = v;
    return OK;
}

/* Read the next oneof member of an AnyValue from r; *field 0 at the end. */
static int
next_member(Reader *r, uint32_t *field, Reader *bytes, uint64_t *number)
{
    int wire;
    while (r->p < r->end) {
        TRY(read_tag(r, field, &wire));
        switch (*field) {
        case 1:
        case 5:
        case 6:
        case 7:
            if (wire != LEN) {
                return UNSUPPORTED;
            }
            return read_len(r, bytes);
        case 2:
        case 3:
        case 8:
            if (wire != VARINT) {
                return UNSUPPORTED;
            }
            return read_varint(r, number);
        case 4:
            if (wire != I64) {
                return UNSUPPORTED;
            }
            return read_fixed64(r, number);
        default:
            TRY(skip_field(r, wire));
        }
    }
    *field = 0;
    return OK;
}

/* `railtrace.otlp.decode.any_value(value, depth)`. The last oneof member set wins, as in
 * protobuf, unless a message member follows itself (protobuf merges the two: not mirrored);
 * members set before the last are still checked, as upb parses them. */
static int
any_value(Reader r, int depth, int nest, PyObject **out)
{
    uint32_t field, last = 0;
    Reader bytes = {NULL, NULL}, last_bytes = {NULL, NULL};
    uint64_t number = 0, last_number = 0;
    Py_ssize_t members = 0;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    Reader scan = r;
    for (;;) {
        TRY(next_member(&scan, &field, &bytes, &number));
        if (field == 0) {
            break;
        }
        if ((field == 5 || field == 6) && field == last) {
            return UNSUPPORTED;
        }
        last = field;
        last_bytes = bytes;
        last_number = number;
        members++;
    }
    if (members > 1) { /* rare: check the members the last one replaced */
        scan = r;
        for (Py_ssize_t i = 0; i < members - 1; i++) {
            TRY(next_member(&scan, &field, &bytes, &number));
            TRY(member(field, bytes, number, depth, nest, NULL));
        }
    }
    return member(last, last_bytes, last_number, depth, nest, out);
}

/* `railtrace.otlp.decode.attributes`: one KeyValue of a span's or an event's attributes,
 * added to attrs (unless NULL: beyond MAX_ATTRIBUTES, only checked) unless its key is in drop. */
static int
attribute(Reader r, int nest, PyObject *drop, PyObject *attrs)
{
    PyObject *key = NULL, *value = NULL;
    Reader v = {NULL, NULL};
    int has_value;
    int rc = key_value(r, nest, attrs != NULL ? &key : NULL, &v, &has_value);
    if (rc == OK && attrs != NULL) {
        int dropped = PySet_Contains(drop, key);
        if (dropped < 0) {
            rc = FAILED;
        }
        else if (dropped) {
            Py_CLEAR(key);
            attrs = NULL;
        }
    }
    if (rc == OK) {
        rc = kv_value(v, has_value, 0, nest + 1, attrs != NULL ? &value : NULL);
    }
    if (rc == OK && attrs != NULL) {
        rc = PyDict_SetItem(attrs, key, value) < 0 ? FAILED : OK;
    }
    Py_XDECREF(key);
    Py_XDECREF(value);
    return rc;
}

static PyObject *s_name, *s_time_ns, *s_attributes; /* event dict keys */

/* An Event as {"name", "time_ns", "attributes"}, appended to events unless NULL (checked only). */
static int
event(Reader r, int nest, PyObject *drop, PyObject *events)
{
    uint32_t field;
    int wire;
    uint64_t time_ns = 0;
    PyObject *name = NULL, *attrs = NULL, *d = NULL, *t = NULL;
    Py_ssize_t n_attrs = 0;
    int rc = OK;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    if (events != NULL && (attrs = PyDict_New()) == NULL) {
        return FAILED;
    }
    while (r.p < r.end) {
        Reader s;
        if ((rc = read_tag(&r, &field, &wire)) != OK) {
            goto done;
        }
        if (field == 1) {
            rc = wire == I64 ? read_fixed64(&r, &time_ns) : UNSUPPORTED;
        }
        else if (field == 2) {
            rc = wire == LEN ? read_len(&r, &s) : UNSUPPORTED;
            if (rc == OK) {
                rc = set_str(s, MAX_EVENT_NAME, events != NULL ? &name : NULL);
            }
        }
        else if (field == 3) {
            rc = wire == LEN ? read_len(&r, &s) : UNSUPPORTED;
            if (rc == OK) {
                rc = attribute(s, nest + 1, drop, n_attrs < MAX_ATTRIBUTES ? attrs : NULL);
                n_attrs++;
            }
        }
        else if (field == 4) {
            uint64_t ignored;
            rc = wire == VARINT ? read_varint(&r, &ignored) : UNSUPPORTED;
        }
        else {
            rc = skip_field(&r, wire);
        }
        if (rc != OK) {
            goto done;
        }
    }
    if (events != NULL) {
        rc = FAILED;
        if (name == NULL && (name = PyUnicode_FromStringAndSize("", 0)) == NULL) {
            goto done;
        }
        if ((t = PyLong_FromUnsignedLongLong(time_ns)) == NULL || (d = PyDict_New()) == NULL) {
            goto done;
        }
        if (PyDict_SetItem(d, s_name, name) < 0 || PyDict_SetItem(d, s_time_ns, t) < 0 ||
            PyDict_SetItem(d, s_attributes, attrs) < 0 || PyList_Append(events, d) < 0) {
            goto done;
        }
        rc = OK;
    }
done:
    Py_XDECREF(name);
    Py_XDECREF(attrs);
    Py_XDECREF(d);
    Py_XDECREF(t);
    return rc;
}

/* A Link: nothing of it is kept, but upb parses and checks all of it. */
static int
check_link(Reader r, int nest, PyObject *drop)
{
    uint32_t field;
    int wire;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    while (r.p < r.end) {
        Reader s;
        TRY(read_tag(&r, &field, &wire));
        if (field == 1 || field == 2 || field == 3 || field == 4) {
            if (wire != LEN) {
                return UNSUPPORTED;
            }
            TRY(read_len(&r, &s));
            if (field == 3) {
                TRY(set_str(s, -1, NULL));
            }
            else if (field == 4) {
                TRY(attribute(s, nest + 1, drop, NULL));
            }
        }
        else if (field == 5 || field == 6) {
            if (wire != (field == 5 ? VARINT : I32)) {
                return UNSUPPORTED;
            }
            TRY(skip_field(&r, wire));
        }
        else {
            TRY(skip_field(&r, wire));
        }
    }
    return OK;
}

/* Status: message (bounded) and code. */
static int
status(Reader r, int nest, PyObject **message, int32_t *code)
{
    uint32_t field;
    int wire;
    if (nest > MAX_NESTING) {
        return UNSUPPORTED;
    }
    while (r.p < r.end) {
        TRY(read_tag(&r, &field, &wire));
        if (field == 2) {
            Reader s;
            if (wire != LEN) {
                return UNSUPPORTED;
            }
            TRY(read_len(&r, &s));
            TRY(set_str(s, MAX_STATUS_MESSAGE, message));
        }
        else if (field == 3) {
            uint64_t v;
            if (wire != VARINT) {
                return UNSUPPORTED;
            }
            TRY(read_varint(&r, &v));
            *code = (int32_t)(uint32_t)v; /* an enum is an int32 */
        }
        else {
            TRY(skip_field(&r, wire));
        }
    }
    return OK;
}

/* The wire type each Span field must have; -1: not a Span field (skipped). */
static int
span_field_wire(uint32_t field)
{
    switch (field) {
    case 1: case 2: case 3: case 4: case 5: case 9: case 11: case 13: case 15:
        return LEN;
    case 6: case 10: case 12: case 14:
        return VARINT;
    case 7: case 8:
        return I64;
    case 16:
        return I32;
    default:
        return -1;
    }
}

static PyObject *
span_fields(Reader r, PyObject *drop)
{
    uint32_t field;
    int wire;
    int rc = OK;
    uint64_t start = 0, end = 0, v;
    int32_t kind = 0, code = 0;
    int has_status = 0;
    Reader span_id = {r.p, r.p}, parent = {r.p, r.p};
    Py_ssize_t n_attrs = 0, n_events = 0;
    PyObject *name = NULL, *message = NULL, *sid = NULL, *pid = NULL, *k = NULL, *c = NULL,
             *t0 = NULL, *t1 = NULL, *result = NULL;
    PyObject *attrs = PyDict_New();
    PyObject *events = PyList_New(0);
    if (attrs == NULL || events == NULL) {
        goto fail;
    }
    while (r.p < r.end) {
        Reader s;
        if ((rc = read_tag(&r, &field, &wire)) != OK) {
            goto fail;
        }
        int want = span_field_wire(field);
        if (want < 0) {
            rc = skip_field(&r, wire);
        }
        else if (want != wire) {
            rc = UNSUPPORTED;
        }
        else if (wire == LEN) {
            rc = read_len(&r, &s);
            if (rc != OK) {
                goto fail;
            }
            switch (field) {
            case 2:
                span_id = s;
                break;
            case 3: /* trace_state */
                rc = set_str(s, -1, NULL);
                break;
            case 4:
                parent = s;
                break;
            case 5:
                rc = set_str(s, MAX_NAME, &name);
                break;
            case 9:
                rc = attribute(s, 1, drop, n_attrs < MAX_ATTRIBUTES ? attrs : NULL);
                n_attrs++;
                break;
            case 11:
                rc = event(s, 1, drop, n_events < MAX_EVENTS ? events : NULL);
                n_events++;
                break;
            case 13:
                rc = check_link(s, 1, drop);
                break;
            case 15:
                rc = has_status ? UNSUPPORTED : status(s, 1, &message, &code);
                has_status = 1;
                break;
            default: /* 1: trace_id, taken from the row */
                break;
            }
        }
        else if (wire == I64) {
            rc = read_fixed64(&r, field == 7 ? &start : &end);
        }
        else if (wire == VARINT) {
            rc = read_varint(&r, &v);
            if (rc == OK && field == 6) {
                kind = (int32_t)(uint32_t)v;
            }
        }
        else {
            rc = skip_field(&r, wire);
        }
        if (rc != OK) {
            goto fail;
        }
    }
    if ((name == NULL && (name = PyUnicode_FromStringAndSize("", 0)) == NULL) ||
        (message == NULL && (message = PyUnicode_FromStringAndSize("", 0)) == NULL)) {
        goto fail;
    }
    if ((sid = hex_of(span_id)) == NULL) {
        goto fail;
    }
    if (parent.p == parent.end) {
        pid = Py_NewRef(Py_None);
    }
    else if ((pid = hex_of(parent)) == NULL) {
        goto fail;
    }
    if ((k = PyLong_FromLong(kind)) == NULL || (c = PyLong_FromLong(code)) == NULL ||
        (t0 = PyLong_FromUnsignedLongLong(start)) == NULL ||
        (t1 = PyLong_FromUnsignedLongLong(end)) == NULL) {
        goto fail;
    }
    result = PyTuple_Pack(10, sid, pid, name, k, t0, t1, c, message, attrs, events);
fail:
    Py_XDECREF(name);
    Py_XDECREF(message);
    Py_XDECREF(sid);
    Py_XDECREF(pid);
    Py_XDECREF(k);
    Py_XDECREF(c);
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    Py_XDECREF(attrs);
    Py_XDECREF(events);
    if (rc == UNSUPPORTED) {
        Py_RETURN_NONE;
    }
    return result;
}

PyDoc_STRVAR(decode_doc,
"decode(encoding, drop, /)\n--\n\n"
"(span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message,\n"
"attributes, events) of one OTLP Span encoding, bounded as span_from_pb bounds them, with\n"
"attribute keys in `drop` (a set or frozenset) left out; None when the encoding holds\n"
"anything not mirrored here (take the upb path for it).");

static PyObject *
decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "decode() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyAnySet_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode(): drop must be a set or frozenset");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Reader r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    PyObject *result = span_fields(r, args[1]);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL, decode_doc},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    if (s_name == NULL) {
        s_name = PyUnicode_InternFromString("name");
        s_time_ns = PyUnicode_InternFromString("time_ns");
        s_attributes = PyUnicode_InternFromString("attributes");
        if (s_name == NULL || s_time_ns == NULL || s_attributes == NULL) {
            return -1;
        }
    }
    PyObject *bounds = Py_BuildValue(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "MAX_ATTR_VALUE_CHARS", MAX_ATTR_VALUE_CHARS,
        "MAX_ARRAY_ITEMS", MAX_ARRAY_ITEMS, "MAX_DEPTH", MAX_DEPTH, "MAX_ATTRIBUTES", MAX_ATTRIBUTES,
        "MAX_EVENTS", MAX_EVENTS, "MAX_NAME", MAX_NAME, "MAX_STATUS_MESSAGE", MAX_STATUS_MESSAGE,
        "MAX_EVENT_NAME", MAX_EVENT_NAME);
    if (bounds == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "BOUNDS", bounds) < 0) {
        Py_DECREF(bounds);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_mod_multiple_interpreters
    /* The key cache and the event keys are process-wide objects. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "railtrace.otlp._spandecode",
    .m_doc = "Stored OTLP spans to plain Python values without upb (see railtrace.otlp.spans).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__spandecode(void)
{
    return PyModuleDef_Init(&module_def);
}
