/* The KV shim's hot path in C: the same five NIXL patches as the Python ones in instrumentor.py
 * (make_prepped_xfer, transfer, check_xfer_state, get_xfer_telemetry, release_xfer_handle), for
 * the common call only.
 *
 * Why: with UCX's `cma` the copy runs inside `transfer()` on vLLM's engine thread and evicts its
 * caches; a Python patch then pays for its frame, bytecode, closure cells and inline caches being
 * fetched again (about 1-2 us per patch on a KVM guest after a 256 MiB copy, measured in
 * benchmarks/shims). This object touches the record, the handle, two context variables and
 * the clock.
 *
 * Contract with instrumentor.py (the record layout is `_Record` there):
 *   rec = [0 post ns, 1 scope, 2 otel context, 3 raw, 4 agent, 5 state, 6 end ns, 7 telemetry,
 *          8 closed]
 * Any call this object does not take fast (keyword arguments, odd arity, a handle without the
 * `_railtrace_record` slot, a re-posted handle) goes to `fallback`, the Python patch, whole:
 * the Python code stays the one description of every slow case. Bookkeeping never raises into
 * the host: on an internal error the exception is cleared and NIXL's result is returned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifdef Py_GIL_DISABLED
/* The record stores rely on the GIL; a free-threaded build uses the Python patches. */
#error "the KV shim's C hot path needs the GIL"
#endif
#include <stddef.h>
#include <structmember.h>
#include <time.h>

#define REC_LEN 9

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *original;     /* NIXL's method */
    PyObject *fallback;     /* the Python patch: every call not taken here */
    PyObject *handles;      /* dict id(handle) -> record, for handles without the slot (prep) */
    PyObject *queue_append; /* deque.append of the emitter's queue, or None (inline mode) */
    PyObject *scope_var;    /* ContextVar: the request's scope */
    PyObject *context_var;  /* ContextVar of the OTel context, or None */
    PyObject *parent_now;   /* otel get_current, when context_var is None */
    PyObject *on_end;       /* callable(rec) in inline mode, or None */
    PyObject *on_raise;     /* callable(rec, exc): a post or poll raised */
    PyObject *on_release;   /* callable(agent, handle, rec): release of a transfer not closed */
    PyObject *handle_type;  /* the shim's subclass of NIXL's handle class, or None */
    Py_ssize_t slot_offset; /* where its `_railtrace_record` slot sits in a handle, or -1 */
} Hot;

static PyObject *s_slot;  /* "_railtrace_record" */
static PyObject *s_telemetry_flag;  /* "_railtrace_telemetry" */
static PyObject *s_proc;  /* "PROC" */

static PyObject *
now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec);
}

/* rec[i] = v (steals v; v NULL leaves the slot alone and clears the error). */
static inline void
rec_store(PyObject *rec, Py_ssize_t i, PyObject *v)
{
    if (v == NULL) {
        PyErr_Clear();
        return;
    }
    if (i >= PyList_GET_SIZE(rec)) { /* never for the shim's records; memory safety first */
        Py_DECREF(v);
        return;
    }
    PyObject *old = PyList_GET_ITEM(rec, i);
    PyList_SET_ITEM(rec, i, v);
    Py_XDECREF(old);
}

/* The handle's record through its slot: a new reference to a list of REC_LEN, Py_None (the
 * slot holds none or something else), or NULL with no error set when the handle has no slot.
 * A handle of the shim's own class is read at the slot's offset, as the interpreter's
 * specialised slot read does (no attribute lookup: two objects fewer to fetch after a copy). */
static PyObject *
record_of(Hot *self, PyObject *handle)
{
    PyObject *rec;
    if (self->slot_offset >= 0 && (PyObject *)Py_TYPE(handle) == self->handle_type) {
        rec = *(PyObject **)((char *)handle + self->slot_offset);
        if (rec == NULL) {
            return NULL; /* the slot was never set */
        }
        Py_INCREF(rec);
    } else {
        rec = PyObject_GetAttr(handle, s_slot);
        if (rec == NULL) {
            PyErr_Clear();
            return NULL;
        }
    }
    if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != REC_LEN) {
        Py_DECREF(rec);
        Py_RETURN_NONE;
    }
    return rec;
}

/* handle._railtrace_record = value; -1 with no error set when the handle has no such slot. */
static int
set_record(Hot *self, PyObject *handle, PyObject *value)
{
    if (self->slot_offset >= 0 && (PyObject *)Py_TYPE(handle) == self->handle_type) {
        PyObject **where = (PyObject **)((char *)handle + self->slot_offset);
        PyObject *old = *where;
        Py_INCREF(value);
        *where = value;
        Py_XDECREF(old);
        return 0;
    }
    if (PyObject_SetAttr(handle, s_slot, value) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static PyObject *
call_fallback(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* The common call of a per-handle method, `(agent, handle[, notif_msg])` with at most
 * `max_nargs` positional arguments and no keywords, on a handle with the slot (NIXL 1.5.1's
 * signatures, docs/shims.md): the handle's record (a new reference, or Py_None). NULL when the
 * call is to go, whole, to the Python patch. */
static PyObject *
fast_record(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames, Py_ssize_t max_nargs)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 2 || nargs > max_nargs) {
        return NULL;
    }
    return record_of(self, args[1]);
}

/* A cold-path hook (raise, inline end, release): its errors are the shim's, never the host's. */
static void
call_hook(PyObject *hook, PyObject *const *args, Py_ssize_t n)
{
    if (hook == NULL || hook == Py_None) {
        return;
    }
    PyObject *r = PyObject_Vectorcall(hook, args, n, NULL);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
}

/* Still a record after NIXL's call ran arbitrary code (memory safety, not trust: the shim
 * never resizes a record, but nothing else may make these stores write past a list). */
static inline int
still_record(PyObject *rec)
{
    return PyList_GET_SIZE(rec) == REC_LEN;
}

/* NIXL's call raised: hand the exception to `on_raise(rec, exc)` and leave it set, unchanged. */
static void
report_raise(Hot *self, PyObject *rec)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    if (exc != NULL) {
        PyObject *hook_args[2] = {rec, exc};
        call_hook(self->on_raise, hook_args, 2);
    }
    PyErr_SetRaisedException(exc);
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (ev != NULL) {
        if (tb != NULL) {
            PyException_SetTraceback(ev, tb);
        }
        PyObject *hook_args[2] = {rec, ev};
        call_hook(self->on_raise, hook_args, 2);
    }
    PyErr_Restore(et, ev, tb);
#endif
}

static void
mark_end(Hot *self, PyObject *rec, PyObject *state)
{
    if (!still_record(rec)) {
        return;
    }
    Py_INCREF(state);
    rec_store(rec, 5, state); /* state, then end: the emitter takes a record once its end is set */
    rec_store(rec, 6, now_ns());
    if (self->on_end != Py_None) {
        call_hook(self->on_end, &rec, 1);
    }
}

static PyObject *
hot_prep(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        return call_fallback(self, args, nargsf, kwnames);
    }
    PyObject *handle = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (handle == NULL) {
        return NULL;
    }
    PyObject *agent = args[0];
    PyObject *quiet = Py_True;
    PyObject *flag = PyObject_GetAttr(agent, s_telemetry_flag);
    if (flag == NULL) {
        PyErr_Clear();
    } else {
        int t = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (t < 0) {
            PyErr_Clear();
        } else {
            quiet = t ? Py_False : Py_True;
        }
    }
    PyObject *pos = PyTuple_New(nargs - 1);
    PyObject *kw = PyDict_New();
    PyObject *raw = NULL, *rec = NULL;
    if (pos == NULL || kw == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(pos, i - 1, args[i]);
    }
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                goto done;
            }
        }
    }
    raw = PyTuple_Pack(5, handle, agent, pos, kw, Py_True);
    rec = PyList_New(REC_LEN);
    if (raw == NULL || rec == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < REC_LEN; i++) {
        PyObject *v = i == 3 ? raw : i == 4 ? agent : i == 8 ? quiet : Py_None;
        Py_INCREF(v);
        PyList_SET_ITEM(rec, i, v);
    }
    if (set_record(self, handle, rec) < 0) {
        PyObject *key = PyLong_FromVoidPtr(handle);
        if (key != NULL) {
            PyDict_SetItem(self->handles, key, rec);
            Py_DECREF(key);
        }
    }
done:
    PyErr_Clear();
    Py_XDECREF(pos);
    Py_XDECREF(kw);
    Py_XDECREF(raw);
    Py_XDECREF(rec);
    return handle;
}

static PyObject *
hot_post(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *rec = fast_record(self, args, nargsf, kwnames, 3);
    if (rec == NULL || rec == Py_None || PyList_GET_ITEM(rec, 0) != Py_None) {
        /* no slot, no record, or posted again: the Python patch makes the new record */
        Py_XDECREF(rec);
        return call_fallback(self, args, nargsf, kwnames);
    }
    /* before the copy: the request's scope and its trace context by reference, the post time */
    PyObject *v = NULL;
    if (PyContextVar_Get(self->scope_var, Py_None, &v) < 0) {
        v = NULL;
    }
    rec_store(rec, 1, v);
    if (self->context_var != Py_None) {
        if (PyContextVar_Get(self->context_var, Py_None, &v) < 0) {
            v = NULL;
        }
    } else {
        v = PyObject_CallNoArgs(self->parent_now);
    }
    rec_store(rec, 2, v);
    rec_store(rec, 0, now_ns());
    if (self->queue_append != Py_None) {
        PyObject *r = PyObject_CallOneArg(self->queue_append, rec);
        if (r == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    PyObject *state = PyObject_Vectorcall(self->original, args, nargsf, NULL);
    if (state == NULL) {
        report_raise(self, rec);
        Py_DECREF(rec);
        return NULL;
    }
    /* DONE or ERR inside the post (cma, small transfers) */
    int proc = PyObject_RichCompareBool(state, s_proc, Py_EQ);
    if (proc == 0) {
        mark_end(self, rec, state);
    } else if (proc < 0) {
        PyErr_Clear();
    }
    Py_DECREF(rec);
    return state;
}

static PyObject *
hot_poll(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *rec = fast_record(self, args, nargsf, kwnames, 2);
    if (rec == NULL) {
        return call_fallback(self, args, nargsf, kwnames);
    }
    PyObject *state = PyObject_Vectorcall(self->original, args, nargsf, NULL);
    if (state == NULL) {
        if (rec != Py_None) {
            report_raise(self, rec);
        }
        Py_DECREF(rec);
        return NULL;
    }
    if (rec != Py_None && still_record(rec) && PyList_GET_ITEM(rec, 6) == Py_None &&
        PyList_GET_ITEM(rec, 0) != Py_None) {
        int proc = PyObject_RichCompareBool(state, s_proc, Py_EQ);
        if (proc == 0) {
            mark_end(self, rec, state);
        } else if (proc < 0) {
            PyErr_Clear();
        }
    }
    Py_DECREF(rec);
    return state;
}

static PyObject *
hot_telemetry(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *rec = fast_record(self, args, nargsf, kwnames, 2);
    if (rec == NULL) {
        return call_fallback(self, args, nargsf, kwnames);
    }
    PyObject *tel = PyObject_Vectorcall(self->original, args, nargsf, NULL);
    /* vLLM (0.12 on) reads it right after DONE: the shim keeps that object, no second read */
    if (tel != NULL && rec != Py_None && still_record(rec) && PyList_GET_ITEM(rec, 6) != Py_None &&
        PyList_GET_ITEM(rec, 7) == Py_None) {
        Py_INCREF(tel);
        rec_store(rec, 7, tel);
        Py_INCREF(Py_True);
        rec_store(rec, 8, Py_True);
    }
    Py_DECREF(rec);
    return tel;
}

static PyObject *
hot_release(Hot *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *rec = fast_record(self, args, nargsf, kwnames, 2);
    if (rec == NULL) {
        return call_fallback(self, args, nargsf, kwnames);
    }
    /* the record refers to its handle: clear the slot, no cycle */
    set_record(self, args[1], Py_None);
    if (rec != Py_None && PyList_GET_ITEM(rec, 0) != Py_None) {
        int open = PyList_GET_ITEM(rec, 6) == Py_None;
        if (!open) {
            int closed = PyObject_IsTrue(PyList_GET_ITEM(rec, 8));
            open = closed == 0;
            if (closed < 0) {
                PyErr_Clear();
            }
        }
        if (open) { /* ended without telemetry kept, or not ended: the Python side closes it */
            PyObject *hook_args[3] = {args[0], args[1], rec};
            call_hook(self->on_release, hook_args, 3);
        }
    }
    Py_DECREF(rec);
    return PyObject_Vectorcall(self->original, args, nargsf, NULL);
}

static const vectorcallfunc KINDS[] = {
    (vectorcallfunc)hot_prep, (vectorcallfunc)hot_post, (vectorcallfunc)hot_poll,
    (vectorcallfunc)hot_telemetry, (vectorcallfunc)hot_release,
};
static const char *const KIND_NAMES[] = {
    "make_prepped_xfer", "transfer", "check_xfer_state", "get_xfer_telemetry", "release_xfer_handle",
};

static int
hot_traverse(Hot *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->original);
    Py_VISIT(self->fallback);
    Py_VISIT(self->handles);
    Py_VISIT(self->queue_append);
    Py_VISIT(self->scope_var);
    Py_VISIT(self->context_var);
    Py_VISIT(self->parent_now);
    Py_VISIT(self->on_end);
    Py_VISIT(self->on_raise);
    Py_VISIT(self->on_release);
    Py_VISIT(self->handle_type);
    return 0;
}

static int
hot_clear(Hot *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->original);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->handles);
    Py_CLEAR(self->queue_append);
    Py_CLEAR(self->scope_var);
    Py_CLEAR(self->context_var);
    Py_CLEAR(self->parent_now);
    Py_CLEAR(self->on_end);
    Py_CLEAR(self->on_raise);
    Py_CLEAR(self->on_release);
    Py_CLEAR(self->handle_type);
    return 0;
}

static void
hot_dealloc(Hot *self)
{
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A method of nixl_agent: bound like a function, called unbound with the agent first. */
static PyObject *
hot_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *
hot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"kind", "original", "fallback", "handles", "queue_append", "scope_var",
                             "context_var", "parent_now", "on_end", "on_raise", "on_release",
                             "handle_type", NULL};
    const char *kind_name;
    PyObject *o[10];
    PyObject *handle_type = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOOO!OOOOOOO|O", kwlist, &kind_name, &o[0], &o[1],
                                     &PyDict_Type, &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                     &o[9], &handle_type)) {
        return NULL;
    }
    /* The slot's offset, from the class's own member descriptor (an object slot of that class). */
    Py_ssize_t offset = -1;
    if (handle_type != Py_None) {
        if (!PyType_Check(handle_type)) {
            PyErr_SetString(PyExc_TypeError, "handle_type must be a class");
            return NULL;
        }
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)handle_type)->tp_dict, s_slot);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_common.d_type != (PyTypeObject *)handle_type ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "handle_type has no _railtrace_record slot of its own");
            }
            return NULL;
        }
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    int kind = -1;
    for (int i = 0; i < (int)(sizeof(KIND_NAMES) / sizeof(KIND_NAMES[0])); i++) {
        if (strcmp(kind_name, KIND_NAMES[i]) == 0) {
            kind = i;
        }
    }
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "no hot path for %s", kind_name);
        return NULL;
    }
    if (!PyCallable_Check(o[0]) || !PyCallable_Check(o[1])) {
        PyErr_SetString(PyExc_TypeError, "original and fallback must be callable");
        return NULL;
    }
    if (!PyContextVar_CheckExact(o[4]) || (o[5] != Py_None && !PyContextVar_CheckExact(o[5]))) {
        PyErr_SetString(PyExc_TypeError, "scope_var and context_var must be ContextVars");
        return NULL;
    }
    Hot *self = (Hot *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = KINDS[kind];
    PyObject **fields[10] = {&self->original, &self->fallback, &self->handles, &self->queue_append,
                             &self->scope_var, &self->context_var, &self->parent_now, &self->on_end,
                             &self->on_raise, &self->on_release};
    for (int i = 0; i < 10; i++) {
        Py_INCREF(o[i]);
        *fields[i] = o[i];
    }
    Py_INCREF(handle_type);
    self->handle_type = handle_type;
    self->slot_offset = offset;
    return (PyObject *)self;
}

static PyObject *
hot_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *
hot_get_original(Hot *self, void *closure)
{
    Py_INCREF(self->original);
    return self->original;
}

static PyGetSetDef hot_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"__wrapped__", (getter)hot_get_original, NULL, "NIXL's method", NULL},
    {NULL},
};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "railtrace_tracing.kv_transfer._hotpath.HotPatch",
    .tp_doc = "One of the KV shim's NIXL patches, the common call in C (see instrumentor.py).",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = hot_new,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_call = hot_call,
    .tp_vectorcall_offset = offsetof(Hot, vectorcall),
    .tp_descr_get = hot_descr_get,
    .tp_dictoffset = offsetof(Hot, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_getset = hot_getset,
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "railtrace_tracing.kv_transfer._hotpath",
    .m_doc = "The KV shim's NIXL patches for the common call, in C (optional; see instrumentor.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    if (PyType_Ready(&HotType) < 0) {
        return NULL;
    }
    s_slot = PyUnicode_InternFromString("_railtrace_record");
    s_telemetry_flag = PyUnicode_InternFromString("_railtrace_telemetry");
    s_proc = PyUnicode_InternFromString("PROC");
    if (s_slot == NULL || s_telemetry_flag == NULL || s_proc == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) {
        return NULL;
    }
    /* The NIXL methods it has a patch for, in the order of KIND_NAMES (instrumentor.py reads it). */
    Py_ssize_t n = (Py_ssize_t)(sizeof(KIND_NAMES) / sizeof(KIND_NAMES[0]));
    PyObject *methods = PyTuple_New(n);
    if (methods == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyUnicode_InternFromString(KIND_NAMES[i]);
        if (name == NULL) {
            Py_DECREF(methods);
            Py_DECREF(m);
            return NULL;
        }
        PyTuple_SET_ITEM(methods, i, name);
    }
    if (PyModule_AddObject(m, "METHODS", methods) < 0) {
        Py_DECREF(methods);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&HotType);
    if (PyModule_AddObject(m, "HotPatch", (PyObject *)&HotType) < 0) {
        Py_DECREF(&HotType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
