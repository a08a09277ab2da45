/* toggleshim._speedups: the flat block's two kernels in C.
 *
 * The reference is Python: ``_enter_flat`` and ``_leave_flat`` in toggleshim/_toggle.py. These
 * functions do exactly what those do (the same reads, in the same order, the same changes, the same
 * exceptions), and tests/test_speedups.py checks it on generated layouts, records and failures. They
 * exist because the flat block is the hot path: at 10 parameters the interpreter's own work around
 * a handful of reads and writes is what a toggle costs (see README, "Performance").
 *
 * The optional build (setup.py): without a compiler toggleshim runs the Python kernels, unchanged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The layout markers (see _toggle._layout); toggleshim._toggle uses these very objects. */
static PyObject *TOGGLED, *END;
static PyObject *S_param_groups, *S_params, *S_requires_grad;

/* Append one item to a layout being compared with ``seq``; *built is NULL while every item so far is
 * seq's, else the layout materialised (the first mismatch copies seq's matching prefix). */
static int
push(PyObject *seq, Py_ssize_t *k, PyObject **built, PyObject *item)
{
    if (*built == NULL) {
        if (*k < PyTuple_GET_SIZE(seq) && PyTuple_GET_ITEM(seq, *k) == item) {
            (*k)++;
            return 0;
        }
        *built = PyList_New(0);
        if (*built == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < *k; i++)
            if (PyList_Append(*built, PyTuple_GET_ITEM(seq, i)) < 0)
                return -1;
    }
    (*k)++;
    return PyList_Append(*built, item);
}

/* ``_layout(opts, optimizer, inner)`` compared with ``seq`` (a tuple) while it is read, item by item,
 * by identity. Returns NULL with an exception set (what reading raised), Py_None (a new reference)
 * when the layout is ``seq``, else the layout as a new list. Reads exactly what _layout reads. */
static PyObject *
layout_against(PyObject *opts, PyObject *optimizer, PyObject *inner, PyObject *seq)
{
    PyObject *built = NULL, *it = NULL, *opt = NULL, *groups = NULL, *git = NULL, *group = NULL;
    PyObject *params = NULL;
    Py_ssize_t k = 0;

    it = PyObject_GetIter(opts);
    if (it == NULL)
        return NULL;
    while ((opt = PyIter_Next(it)) != NULL) {
        if ((opt == optimizer || opt == inner) && push(seq, &k, &built, TOGGLED) < 0)
            goto error;
        groups = PyObject_GetAttr(opt, S_param_groups);
        Py_CLEAR(opt);
        if (groups == NULL)
            goto error;
        git = PyObject_GetIter(groups);
        Py_CLEAR(groups);
        if (git == NULL)
            goto error;
        while ((group = PyIter_Next(git)) != NULL) {
            params = PyObject_GetItem(group, S_params);
            Py_CLEAR(group);
            if (params == NULL)
                goto error;
            if (!PyList_CheckExact(params) && !PyTuple_CheckExact(params)) {
                /* ``seq += params``: list.extend, which takes a length hint and iterates */
                PyObject *as_list = PySequence_List(params);
                Py_SETREF(params, as_list);
                if (params == NULL)
                    goto error;
            }
            /* While the items match, nothing is allocated and no Python code runs. After a mismatch
             * ``push`` allocates, which may run the cyclic GC and finalizers that change the list:
             * its size and items are read afresh each time and the item is held while pushed. */
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(params); i++) {
                PyObject *item = PySequence_Fast_ITEMS(params)[i];
                if (built == NULL && k < PyTuple_GET_SIZE(seq) && PyTuple_GET_ITEM(seq, k) == item) {
                    k++;
                    continue;
                }
                Py_INCREF(item);
                int pushed = push(seq, &k, &built, item);
                Py_DECREF(item);
                if (pushed < 0)
                    goto error;
            }
            Py_CLEAR(params);
        }
        Py_CLEAR(git);
        if (PyErr_Occurred())
            goto error;
        if (push(seq, &k, &built, END) < 0)
            goto error;
    }
    Py_CLEAR(it);
    if (PyErr_Occurred())
        goto error;
    if (built == NULL && k != PyTuple_GET_SIZE(seq)) {  /* a prefix of seq: shorter */
        built = PyTuple_GetSlice(seq, 0, k);
        if (built == NULL)
            return NULL;
        Py_SETREF(built, PySequence_List(built));
        return built;
    }
    if (built == NULL)
        Py_RETURN_NONE;
    return built;

error:
    Py_XDECREF(built);
    Py_XDECREF(it);
    Py_XDECREF(opt);
    Py_XDECREF(groups);
    Py_XDECREF(git);
    Py_XDECREF(group);
    Py_XDECREF(params);
    return NULL;
}

static int
check_tuples(const char *name, PyObject *const *args, Py_ssize_t first, Py_ssize_t last)
{
    for (Py_ssize_t i = first; i <= last; i++) {
        if (!PyTuple_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "%s(): argument %zd must be a tuple", name, i + 1);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(enter_flat_doc,
"enter_flat(opts, optimizer, inner, seq, managed, free)\n--\n\n"
"_toggle._enter_flat in C: the layout as a list if it is not ``seq`` (nothing changed); else every\n"
"``managed`` parameter's requires_grad (a tuple, read first), after ``free``'s are set to False.");

static PyObject *
enter_flat(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "enter_flat() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (check_tuples("enter_flat", args, 3, 5) < 0)
        return NULL;
    PyObject *layout = layout_against(args[0], args[1], args[2], args[3]);
    if (layout != Py_None)
        return layout;  /* a list, or NULL */
    Py_DECREF(layout);
    PyObject *managed = args[4], *free_ = args[5];
    Py_ssize_t n = PyTuple_GET_SIZE(managed);
    PyObject *vals = PyTuple_New(n);
    if (vals == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyObject_GetAttr(PyTuple_GET_ITEM(managed, i), S_requires_grad);
        if (value == NULL) {
            Py_DECREF(vals);
            return NULL;
        }
        PyTuple_SET_ITEM(vals, i, value);
    }
    n = PyTuple_GET_SIZE(free_);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_SetAttr(PyTuple_GET_ITEM(free_, i), S_requires_grad, Py_False) < 0) {
            Py_DECREF(vals);
            return NULL;
        }
    }
    return vals;
}

PyDoc_STRVAR(leave_flat_doc,
"leave_flat(opts, optimizer, inner, record, vals, seq, last_vals, last_record, restore, restore_vals)\n--\n\n"
"_toggle._leave_flat in C: True after giving ``restore`` the values ``restore_vals`` when the layout\n"
"is still ``seq`` and ``record`` is still what was handed out; False (nothing changed) otherwise.");

static PyObject *
leave_flat(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "leave_flat() takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    if (check_tuples("leave_flat", args, 4, 5) < 0 || check_tuples("leave_flat", args, 8, 9) < 0)
        return NULL;
    PyObject *record = args[3], *vals = args[4], *seq = args[5], *last_vals = args[6];
    PyObject *last_record = args[7], *restore = args[8], *restore_vals = args[9];
    if (!PyDict_CheckExact(record))
        Py_RETURN_FALSE;
    int same = PyObject_RichCompareBool(vals, last_vals, Py_EQ);
    if (same <= 0)
        return same < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *layout = layout_against(args[0], args[1], args[2], seq);
    if (layout == NULL)
        same = -1;
    else {
        same = layout == Py_None;
        Py_DECREF(layout);
    }
    if (same > 0)  /* each parameter found, with an equal value (dict_equal, as Lightning's lookups) */
        same = PyObject_RichCompareBool(last_record, record, Py_EQ);
    if (same > 0) {  /* the values: the very bools recorded, in order */
        Py_ssize_t pos = 0, i = 0, n = PyTuple_GET_SIZE(vals);
        PyObject *key, *value;
        while (same && PyDict_Next(record, &pos, &key, &value)) {
            if (i >= n || value != PyTuple_GET_ITEM(vals, i))
                same = 0;
            i++;
        }
    }
    if (same < 0) {  /* unreadable lists, a failing comparison: the long way raises what Lightning's does */
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
        same = 0;
    }
    if (!same)
        Py_RETURN_FALSE;
    Py_ssize_t n = PyTuple_GET_SIZE(restore);
    if (PyTuple_GET_SIZE(restore_vals) < n)
        n = PyTuple_GET_SIZE(restore_vals);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_SetAttr(PyTuple_GET_ITEM(restore, i), S_requires_grad, PyTuple_GET_ITEM(restore_vals, i)) < 0)
            return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"enter_flat", (PyCFunction)(void (*)(void))enter_flat, METH_FASTCALL, enter_flat_doc},
    {"leave_flat", (PyCFunction)(void (*)(void))leave_flat, METH_FASTCALL, leave_flat_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups = {
    PyModuleDef_HEAD_INIT, "toggleshim._speedups", "C kernels of toggleshim._toggle (see its _enter_flat).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    S_param_groups = PyUnicode_InternFromString("param_groups");
    S_params = PyUnicode_InternFromString("params");
    S_requires_grad = PyUnicode_InternFromString("requires_grad");
    TOGGLED = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    END = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (!S_param_groups || !S_params || !S_requires_grad || !TOGGLED || !END)
        return NULL;
    PyObject *m = PyModule_Create(&speedups);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "TOGGLED", TOGGLED) < 0 || PyModule_AddObjectRef(m, "END", END) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
