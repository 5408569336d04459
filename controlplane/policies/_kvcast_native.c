/*
 * controlplane.policies._kvcast_native: the kvcast policy's record path in C (docs/policies.md,
 * "Batch path"). The controller records every report of a tick (up to a million block accesses)
 * before it re-ranks; in Python that loop costs 3-5 us per access. This module runs the same
 * per-access update, step for step and in the same floating-point operations, over a batch:
 *
 *   KvMeta                      the statistics of one tracked chunk (the C form of kvcast's
 *                               _Meta: same attribute names, readable and writable from Python).
 *   bind_access(Access)         learn the slot offsets of controlplane.policies.base.Access.
 *   record(...)                 KvcastPolicy._update for each Access of a list, from an index on;
 *                               stops at the first access it cannot take exactly as Python would
 *                               (a subclass, a non-int key, a value outside 64 bits, size <= 0)
 *                               and returns its index, so Python handles that one (and raises its
 *                               own error for a malformed one) and calls again after it.
 *   record_arrays(...)          the same over column arrays (keys, tenants, sizes, hosts, times,
 *                               parents with a mask, positions); stops at a size <= 0.
 *   columns(meta, resident, k)  the statistics rank, select and the pruning read, as arrays.
 *
 * Python's float operations are IEEE doubles and math.log2 / ** are C's log2 / pow, so the
 * results are bit for bit those of the Python path (tests/controlplane/test_policy_native.py
 * compares every statistic and every decision). The module is optional: without it (or with
 * KVCAST_NATIVE=0) the Python path runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <math.h>
#include <stdint.h>

#define N_CLASSES 20

/* ------------------------------------------------------------------ KvMeta */

typedef struct {
    PyObject_HEAD
    PyObject *tenant;
    PyObject *size;
    PyObject *parent;
    long long position;
    long long count;
    long long cls;
    double logs;
    double pri;
    double last;
    double first;
    unsigned long long hosts;
} KvMeta;

static PyTypeObject KvMetaType;

static void meta_defaults(KvMeta *m) {
    m->position = 0;
    m->count = 0;
    m->cls = -1;
    m->logs = -INFINITY;
    m->pri = -INFINITY;
    m->last = -INFINITY;
    m->first = -INFINITY;
    m->hosts = 0;
}

/* A new record's references and defaults (tenant, size, no parent). */
static void meta_init(KvMeta *m, PyObject *tenant, PyObject *size) {
    Py_INCREF(tenant);
    Py_INCREF(size);
    Py_INCREF(Py_None);
    m->tenant = tenant;
    m->size = size;
    m->parent = Py_None;
    meta_defaults(m);
}

static KvMeta *meta_new(PyObject *tenant, PyObject *size) {
    KvMeta *m = PyObject_New(KvMeta, &KvMetaType);
    if (m == NULL) return NULL;
    meta_init(m, tenant, size);
    return m;
}

static PyObject *meta_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *tenant, *size;
    static char *kwlist[] = {"tenant", "size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:KvMeta", kwlist, &tenant, &size)) return NULL;
    KvMeta *m = (KvMeta *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    meta_init(m, tenant, size);
    return (PyObject *)m;
}

static void meta_dealloc(KvMeta *m) {
    Py_XDECREF(m->tenant);
    Py_XDECREF(m->size);
    Py_XDECREF(m->parent);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMemberDef meta_members[] = {
    {"tenant", T_OBJECT_EX, offsetof(KvMeta, tenant), 0, "tenant id"},
    {"size", T_OBJECT_EX, offsetof(KvMeta, size), 0, "bytes"},
    {"parent", T_OBJECT_EX, offsetof(KvMeta, parent), 0, "parent key or None"},
    {"position", T_LONGLONG, offsetof(KvMeta, position), 0, "index in the prefix chain"},
    {"count", T_LONGLONG, offsetof(KvMeta, count), 0, "accesses counted by the classes"},
    {"cls", T_LONGLONG, offsetof(KvMeta, cls), 0, "reuse class of the last access"},
    {"logs", T_DOUBLE, offsetof(KvMeta, logs), 0, "log2 of the decayed weighted count"},
    {"pri", T_DOUBLE, offsetof(KvMeta, pri), 0, "eviction priority (clamped to the parent)"},
    {"last", T_DOUBLE, offsetof(KvMeta, last), 0, "time of the last access"},
    {"first", T_DOUBLE, offsetof(KvMeta, first), 0, "first access time until the first reuse"},
    {"hosts", T_ULONGLONG, offsetof(KvMeta, hosts), 0, "hosts of the current episode"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject KvMetaType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "controlplane.policies._kvcast_native.KvMeta",
    .tp_basicsize = sizeof(KvMeta),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Statistics of one chunk tracked by the kvcast policy (KvMeta(tenant, size)).",
    .tp_new = meta_tp_new,
    .tp_dealloc = (destructor)meta_dealloc,
    .tp_members = meta_members,
};

/* ------------------------------------------------------------------ the policy's state */

typedef struct {
    PyObject *meta;     /* dict key -> KvMeta */
    PyObject *resident; /* dict key -> resident entry */
    PyObject *prune;    /* callable(key): KvcastPolicy._prune */
    PyObject *pushed;   /* list: resident keys accessed, in order */
    int adaptive, learned, has_clock;
    double clock_t, clock_v, half_life, log_gap, gap_factor, min_hl, max_hl, log_repeat;
    double log_history;
    long long gap_samples, cls_samples, max_tracked;
    double latest;
    double entries[N_CLASSES], reuses[N_CLASSES];
    PyObject *entries_list, *reuses_list, *state;
} Ctx;

/* params = (adaptive, learned, gap_factor, min_hl, max_hl, log_repeat, max_tracked,
 *           log_history)
 * state = [clock_t or None, clock_v, half_life, log_gap, gap_samples, cls_samples, latest] */
static int ctx_load(Ctx *c, PyObject *params, PyObject *state, PyObject *entries,
                    PyObject *reuses) {
    if (!PyArg_ParseTuple(params, "ppddddLd", &c->adaptive, &c->learned, &c->gap_factor,
                          &c->min_hl, &c->max_hl, &c->log_repeat, &c->max_tracked,
                          &c->log_history))
        return -1;
    if (!PyList_Check(state) || PyList_GET_SIZE(state) != 7 || !PyList_Check(entries) ||
        !PyList_Check(reuses) || PyList_GET_SIZE(entries) != N_CLASSES ||
        PyList_GET_SIZE(reuses) != N_CLASSES) {
        PyErr_SetString(PyExc_TypeError, "record: bad state, entries or reuses");
        return -1;
    }
    PyObject *ct = PyList_GET_ITEM(state, 0);
    c->has_clock = ct != Py_None;
    c->clock_t = c->has_clock ? PyFloat_AsDouble(ct) : 0.0;
    c->clock_v = PyFloat_AsDouble(PyList_GET_ITEM(state, 1));
    c->half_life = PyFloat_AsDouble(PyList_GET_ITEM(state, 2));
    c->log_gap = PyFloat_AsDouble(PyList_GET_ITEM(state, 3));
    c->gap_samples = PyLong_AsLongLong(PyList_GET_ITEM(state, 4));
    c->cls_samples = PyLong_AsLongLong(PyList_GET_ITEM(state, 5));
    c->latest = PyFloat_AsDouble(PyList_GET_ITEM(state, 6));
    for (int i = 0; i < N_CLASSES; i++) {
        c->entries[i] = PyFloat_AsDouble(PyList_GET_ITEM(entries, i));
        c->reuses[i] = PyFloat_AsDouble(PyList_GET_ITEM(reuses, i));
    }
    if (PyErr_Occurred()) return -1;
    c->entries_list = entries;
    c->reuses_list = reuses;
    c->state = state;
    return 0;
}

static int set_item(PyObject *list, Py_ssize_t i, PyObject *v) {
    if (v == NULL) return -1;
    return PyList_SetItem(list, i, v); /* steals v */
}

static int ctx_store(Ctx *c) {
    PyObject *s = c->state;
    if (c->has_clock && set_item(s, 0, PyFloat_FromDouble(c->clock_t)) < 0) return -1;
    if (set_item(s, 1, PyFloat_FromDouble(c->clock_v)) < 0 ||
        set_item(s, 2, PyFloat_FromDouble(c->half_life)) < 0 ||
        set_item(s, 3, PyFloat_FromDouble(c->log_gap)) < 0 ||
        set_item(s, 4, PyLong_FromLongLong(c->gap_samples)) < 0 ||
        set_item(s, 5, PyLong_FromLongLong(c->cls_samples)) < 0 ||
        set_item(s, 6, PyFloat_FromDouble(c->latest)) < 0)
        return -1;
    for (int i = 0; i < N_CLASSES; i++) {
        if (set_item(c->entries_list, i, PyFloat_FromDouble(c->entries[i])) < 0 ||
            set_item(c->reuses_list, i, PyFloat_FromDouble(c->reuses[i])) < 0)
            return -1;
    }
    return 0;
}

/* The virtual clock (KvcastPolicy._x). */
static inline double vclock(const Ctx *c, double t) {
    if (!c->has_clock) return 0.0;
    return c->clock_v + (t - c->clock_t) / c->half_life;
}

/* KvcastPolicy._observe_gap; Python's max(a, b) is "b if b > a else a", min(a, b) "b if b < a
 * else a", kept in that form so that ties resolve alike. */
static void observe_gap(Ctx *c, double gap, double now) {
    double step = c->gap_samples >= 64 ? 1.0 / 16 : 0.5;
    c->gap_samples += 1;
    double lg = log2(1e-3 > gap ? 1e-3 : gap);
    if (lg > c->log_gap)
        c->log_gap += step;
    else if (lg < c->log_gap)
        c->log_gap -= step;
    double target = c->gap_factor * pow(2.0, c->log_gap);
    double lo = target > c->min_hl ? target : c->min_hl;
    target = lo < c->max_hl ? lo : c->max_hl;
    if (fabs(log2(target / c->half_life)) > 0.1) {
        c->clock_v = vclock(c, now);
        c->clock_t = now;
        c->half_life = target;
    }
}

static int lookup(Ctx *c, PyObject *key, KvMeta **out) {
    PyObject *v = PyDict_GetItemWithError(c->meta, key);
    if (v == NULL) {
        *out = NULL;
        return PyErr_Occurred() ? -1 : 0;
    }
    if (Py_TYPE(v) != &KvMetaType) {
        PyErr_SetString(PyExc_TypeError, "record: a tracked chunk is not a KvMeta");
        return -1;
    }
    *out = (KvMeta *)v;
    return 0;
}

/* KvcastPolicy._learn: the log2 weight of one access, learned per reuse class. */
static int learn(Ctx *c, KvMeta *m, double now, PyObject *parent, double *out) {
    if (m->cls >= 0) c->reuses[m->cls] += 1.0;
    m->count += 1;
    long long n = m->count;
    int cls = (int)((n < 4 ? n - 1 : n < 8 ? 3 : 4) * 4);
    if (n > 1) {
        double g = (now - m->last) / c->half_life;
        cls += g < 0.25 ? 1 : g < 1.0 ? 2 : 3;
    } else if (parent != NULL) {
        KvMeta *pm;
        if (lookup(c, parent, &pm) < 0) return -1;
        long long pc = pm != NULL ? pm->count : 0;
        cls += pc <= 1 ? 1 : pc < 8 ? 2 : 3;
    }
    m->cls = cls;
    c->entries[cls] += 1.0;
    c->cls_samples += 1;
    if (c->cls_samples >= (1 << 16)) {
        c->cls_samples = 0;
        for (int i = 0; i < N_CLASSES; i++) {
            double h = c->entries[i] / 2;
            c->entries[i] = 1.0 > h ? 1.0 : h;
            c->reuses[i] = c->reuses[i] / 2;
        }
    }
    double share = c->reuses[cls] / c->entries[cls];
    double s = 1.0 / 64 > share ? 1.0 / 64 : share;
    s = 1.0 < s ? 1.0 : s;
    *out = log2(s);
    return 0;
}

/* KvcastPolicy._update for one access that has been checked. parent is NULL for None. */
static int step(Ctx *c, PyObject *key, PyObject *tenant, PyObject *size, long long host,
                double t, PyObject *parent, int has_pos, long long pos) {
    if (!c->has_clock) {
        c->has_clock = 1;
        c->clock_t = t;
    }
    KvMeta *m;
    if (lookup(c, key, &m) < 0) return -1;
    int is_res = PyDict_Contains(c->resident, key);
    if (is_res < 0) return -1;
    if (m == NULL) {
        m = meta_new(tenant, size);
        if (m == NULL) return -1;
        int rc = PyDict_SetItem(c->meta, key, (PyObject *)m);
        Py_DECREF(m); /* the dict holds it */
        if (rc < 0) return -1;
    } else if (!is_res) {
        Py_INCREF(tenant);
        Py_SETREF(m->tenant, tenant);
        Py_INCREF(size);
        Py_SETREF(m->size, size);
    }
    if (m->first == -INFINITY) {
        m->first = t;
    } else if (m->first != INFINITY) {
        if (c->adaptive) observe_gap(c, t - m->first, t);
        m->first = INFINITY;
    }
    double x = vclock(c, t);
    if (t - m->last > c->half_life) m->hosts = 0;
    unsigned long long bit = 1ULL << ((unsigned long long)host & 63);
    double lw = (m->hosts & bit) ? x + c->log_repeat : x;
    if (c->learned) {
        double w;
        if (learn(c, m, t, parent, &w) < 0) return -1;
        lw += w;
    }
    m->hosts |= bit;
    double a = m->logs + c->log_history;
    if (a == -INFINITY)
        m->logs = lw;
    else if (a >= lw)
        m->logs = a + log2(1.0 + pow(2.0, lw - a));
    else
        m->logs = lw + log2(1.0 + pow(2.0, a - lw));
    m->last = t;
    double pri = m->logs;
    if (parent != NULL) {
        Py_INCREF(parent);
        Py_SETREF(m->parent, parent);
        KvMeta *pm;
        if (lookup(c, parent, &pm) < 0) return -1;
        if (pm != NULL) {
            m->position = pm->position + 1;
            if (pm->pri < pri) pri = pm->pri;
        }
    }
    if (has_pos) m->position = pos;
    m->pri = pri;
    if (is_res) return PyList_Append(c->pushed, key);
    if (PyDict_GET_SIZE(c->meta) > c->max_tracked) {
        if (ctx_store(c) < 0) return -1;
        PyObject *r = PyObject_CallOneArg(c->prune, key);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* ------------------------------------------------------------------ Access objects */

enum { F_KEY, F_TENANT, F_SIZE, F_HOST, F_TIME, F_PARENT, F_POSITION, N_FIELDS };
static const char *field_names[N_FIELDS] = {"key",  "tenant", "size",    "host",
                                            "time", "parent", "position"};
static PyTypeObject *access_type = NULL;
static Py_ssize_t field_offset[N_FIELDS];

static PyObject *bind_access(PyObject *self, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind_access needs the Access class");
        return NULL;
    }
    Py_ssize_t offs[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, field_names[i]);
        if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "Access.%s is not a slot", field_names[i]);
            return NULL;
        }
        PyMemberDef *def = ((PyMemberDescrObject *)d)->d_member;
        if (def->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "Access.%s is not an object slot", field_names[i]);
            return NULL;
        }
        offs[i] = def->offset;
    }
    memcpy(field_offset, offs, sizeof offs);
    Py_INCREF(type);
    Py_XSETREF(access_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

static inline PyObject *field(PyObject *obj, int i) {
    return *(PyObject **)((char *)obj + field_offset[i]);
}

/* An int that fits in 64 bits; 0 if it is not an exact int or does not fit (no error left). */
static int as_i64(PyObject *v, long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Take one Access; 1 when done, 0 when Python must handle it, -1 on error. */
static int take_access(Ctx *c, PyObject *a) {
    if (Py_TYPE(a) != access_type) return 0;
    PyObject *key = field(a, F_KEY), *tenant = field(a, F_TENANT), *size = field(a, F_SIZE);
    PyObject *hostv = field(a, F_HOST), *timev = field(a, F_TIME);
    PyObject *parent = field(a, F_PARENT), *posv = field(a, F_POSITION);
    if (!key || !tenant || !size || !hostv || !timev || !parent || !posv) return 0;
    if (!PyLong_CheckExact(key)) return 0;
    unsigned long long k = PyLong_AsUnsignedLongLong(key);
    if (k == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    long long sz, host, pos = 0;
    if (!as_i64(size, &sz) || sz <= 0 || !as_i64(hostv, &host)) return 0;
    double t;
    if (PyFloat_CheckExact(timev)) {
        t = PyFloat_AS_DOUBLE(timev);
    } else {
        long long ti;
        if (!as_i64(timev, &ti) || ti > (1LL << 53) || ti < -(1LL << 53)) return 0;
        t = (double)ti;
    }
    int has_pos = posv != Py_None;
    if (has_pos && !as_i64(posv, &pos)) return 0;
    if (parent == Py_None)
        parent = NULL;
    else if (!PyLong_CheckExact(parent))
        return 0;
    if (t > c->latest) c->latest = t;
    return step(c, key, tenant, size, host, t, parent, has_pos, pos) < 0 ? -1 : 1;
}

static PyObject *record(PyObject *self, PyObject *args) {
    Ctx c;
    PyObject *params, *state, *entries, *reuses, *seq;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O!O!O!O!n:record", &PyDict_Type, &c.meta, &PyDict_Type,
                          &c.resident, &c.prune, &PyTuple_Type, &params, &PyList_Type, &state,
                          &PyList_Type, &entries, &PyList_Type, &reuses, &PyList_Type, &c.pushed,
                          &PyList_Type, &seq, &start))
        return NULL;
    if (access_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "record: bind_access was not called");
        return NULL;
    }
    if (ctx_load(&c, params, state, entries, reuses) < 0) return NULL;
    Py_ssize_t i = start < 0 ? 0 : start;
    /* The size is read at each step: the prune callback runs Python code. */
    for (; i < PyList_GET_SIZE(seq); i++) {
        PyObject *a = PyList_GET_ITEM(seq, i);
        Py_INCREF(a); /* the prune callback runs Python code */
        int r = take_access(&c, a);
        Py_DECREF(a);
        if (r < 0) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            ctx_store(&c); /* the accesses before this one stay recorded */
            PyErr_Restore(et, ev, tb);
            return NULL;
        }
        if (r == 0) break;
    }
    if (ctx_store(&c) < 0) return NULL;
    return PyLong_FromSsize_t(i);
}

/* ------------------------------------------------------------------ column arrays */

static int get_buffer(PyObject *obj, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t n,
                      const char *name) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (b->len != itemsize * n) {
        PyErr_Format(PyExc_ValueError, "record_arrays: %s has %zd bytes, need %zd", name,
                     b->len, itemsize * n);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *record_arrays(PyObject *self, PyObject *args) {
    Ctx c;
    PyObject *params, *state, *entries, *reuses;
    PyObject *cols[8];
    Py_ssize_t n, start;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O!O!O!nOOOOOOOOn:record_arrays", &PyDict_Type, &c.meta,
                          &PyDict_Type, &c.resident, &c.prune, &PyTuple_Type, &params,
                          &PyList_Type, &state, &PyList_Type, &entries, &PyList_Type, &reuses,
                          &PyList_Type, &c.pushed, &n, &cols[0], &cols[1], &cols[2], &cols[3],
                          &cols[4], &cols[5], &cols[6], &cols[7], &start))
        return NULL;
    /* keys u64, tenants i64, sizes i64, hosts i64, times f64, parents u64, has_parent u8,
     * positions i64 (< 0: unknown) */
    static const Py_ssize_t width[8] = {8, 8, 8, 8, 8, 8, 1, 8};
    static const char *names[8] = {"keys",    "tenants", "sizes",      "hosts",
                                   "times",   "parents", "has_parent", "positions"};
    Py_buffer b[8];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 8; got++)
        if (get_buffer(cols[got], &b[got], width[got], n, names[got]) < 0) goto done;
    if (ctx_load(&c, params, state, entries, reuses) < 0) goto done;
    const uint64_t *keys = b[0].buf, *parents = b[5].buf;
    const int64_t *tenants = b[1].buf, *sizes = b[2].buf, *hosts = b[3].buf, *pos = b[7].buf;
    const double *times = b[4].buf;
    const uint8_t *has_parent = b[6].buf;
    PyObject *tenant = NULL, *size = NULL;
    long long last_tenant = 0, last_size = 0;
    Py_ssize_t i = start < 0 ? 0 : start;
    int failed = 0;
    for (; i < n; i++) {
        if (sizes[i] <= 0) break;
        if (tenant == NULL || tenants[i] != last_tenant) {
            Py_XDECREF(tenant);
            last_tenant = tenants[i];
            tenant = PyLong_FromLongLong(last_tenant);
        }
        if (size == NULL || sizes[i] != last_size) {
            Py_XDECREF(size);
            last_size = sizes[i];
            size = PyLong_FromLongLong(last_size);
        }
        PyObject *key = PyLong_FromUnsignedLongLong(keys[i]);
        PyObject *parent = has_parent[i] ? PyLong_FromUnsignedLongLong(parents[i]) : NULL;
        int ok = tenant && size && key && (parent || !has_parent[i]);
        double t = times[i];
        if (ok) {
            if (t > c.latest) c.latest = t;
            ok = step(&c, key, tenant, size, hosts[i], t, parent, pos[i] >= 0, pos[i]) == 0;
        }
        Py_XDECREF(key);
        Py_XDECREF(parent);
        if (!ok) {
            failed = 1;
            break;
        }
    }
    Py_XDECREF(tenant);
    Py_XDECREF(size);
    if (failed) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        ctx_store(&c);
        PyErr_Restore(et, ev, tb);
        goto done;
    }
    if (ctx_store(&c) < 0) goto done;
    result = PyLong_FromSsize_t(i);
done:
    for (int j = 0; j < got; j++) PyBuffer_Release(&b[j]);
    return result;
}

/* ------------------------------------------------------------------ columns of the statistics */

/* columns(meta, resident, keep) -> (keys, logs, pri, position, excluded, min_size): every
 * tracked chunk in the dict's order; logs and pri as float64 bytes, position as int64 bytes,
 * excluded as uint8 bytes (1: resident, or the key ``keep``), min_size the smallest size (None
 * when nothing is tracked). What rank, select and the pruning of KvcastPolicy read. */
static PyObject *columns(PyObject *self, PyObject *args) {
    PyObject *meta, *resident, *keep;
    if (!PyArg_ParseTuple(args, "O!O!O:columns", &PyDict_Type, &meta, &PyDict_Type, &resident,
                          &keep))
        return NULL;
    Py_ssize_t n = PyDict_GET_SIZE(meta);
    PyObject *keys = PyList_New(n);
    PyObject *logs = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *pri = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *pos = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *excl = PyBytes_FromStringAndSize(NULL, n);
    PyObject *min_size = Py_None;
    Py_INCREF(min_size);
    if (!keys || !logs || !pri || !pos || !excl) goto fail;
    double *lp = (double *)PyBytes_AS_STRING(logs), *pp = (double *)PyBytes_AS_STRING(pri);
    int64_t *qp = (int64_t *)PyBytes_AS_STRING(pos);
    uint8_t *ep = (uint8_t *)PyBytes_AS_STRING(excl);
    Py_ssize_t it = 0, i = 0;
    PyObject *k, *v;
    while (PyDict_Next(meta, &it, &k, &v)) {
        if (i >= n || Py_TYPE(v) != &KvMetaType) {
            PyErr_SetString(PyExc_TypeError, "columns: a tracked chunk is not a KvMeta");
            goto fail;
        }
        KvMeta *m = (KvMeta *)v;
        Py_INCREF(k);
        PyList_SET_ITEM(keys, i, k);
        lp[i] = m->logs;
        pp[i] = m->pri;
        qp[i] = m->position;
        int r = PyDict_Contains(resident, k);
        if (r < 0) goto fail;
        if (!r && keep != Py_None) {
            r = PyObject_RichCompareBool(k, keep, Py_EQ);
            if (r < 0) goto fail;
        }
        ep[i] = (uint8_t)r;
        if (min_size == Py_None) {
            Py_INCREF(m->size);
            Py_SETREF(min_size, m->size);
        } else {
            r = PyObject_RichCompareBool(m->size, min_size, Py_LT);
            if (r < 0) goto fail;
            if (r) {
                Py_INCREF(m->size);
                Py_SETREF(min_size, m->size);
            }
        }
        i++;
    }
    if (i != n) {
        PyErr_SetString(PyExc_RuntimeError, "columns: the dict changed size");
        goto fail;
    }
    return Py_BuildValue("(NNNNNN)", keys, logs, pri, pos, excl, min_size);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(logs);
    Py_XDECREF(pri);
    Py_XDECREF(pos);
    Py_XDECREF(excl);
    Py_XDECREF(min_size);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"bind_access", bind_access, METH_O, "Learn the slot offsets of the Access class."},
    {"record", record, METH_VARARGS,
     "record(meta, resident, prune, params, state, entries, reuses, pushed, accesses, start) -> "
     "index of the first access not taken (len(accesses) when all were)."},
    {"record_arrays", record_arrays, METH_VARARGS,
     "record_arrays(meta, resident, prune, params, state, entries, reuses, pushed, n, keys, "
     "tenants, sizes, hosts, times, parents, has_parent, positions, start) -> index of the "
     "first access not taken (a size <= 0), n when all were."},
    {"columns", columns, METH_VARARGS,
     "columns(meta, resident, keep) -> (keys, logs, pri, position, excluded, min_size)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "controlplane.policies._kvcast_native",
    "The kvcast policy's record path in C (optional; see kvcast.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__kvcast_native(void) {
    if (PyType_Ready(&KvMetaType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    Py_INCREF(&KvMetaType);
    if (PyModule_AddObject(mod, "KvMeta", (PyObject *)&KvMetaType) < 0) {
        Py_DECREF(&KvMetaType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
