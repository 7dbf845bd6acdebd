/* attncc's kernel launcher: one prepared cuLaunchKernel, issued from C.

   A Launch holds a kernel's parameters packed in one buffer, as cuLaunchKernel reads them
   (an array of pointers into it), and its slots: the places a call rewrites before
   launching. Each slot is a 64-bit word at byte `at` of the buffer, set to
   `bias + (pointer >> shift)` where `pointer` is the data pointer of one of the call's
   values (a tensor's `data_ptr()`, an int, None for 0): a plain pointer parameter
   (shift 0, bias 0), a pointer at an offset of a scratch block (bias: the offset), or the
   address word of a tensor map packed in the buffer (attncc.runtime.tensor_map's
   AddressField). A slot of `length` 128 takes a whole encoded map (bytes) instead.

   Where a value comes from (`kind`): 0, `inputs[key]` (a dict: the call's tensors by
   name); 1, `items[key]` (a list or tuple); 2, the call's `base` (an int).

   Each Launch has a lock, held from the first write to the end of cuLaunchKernel, which
   copies the parameters: two threads never patch one buffer at once. The GIL is released
   around the driver call, as Triton's launcher does: a launch that waits for room in a
   full launch queue leaves other Python threads running. The driver's entry point is
   passed in as an address (libcuda's cuLaunchKernel, or a test's stand-in), so this file
   needs no CUDA headers.

   The module also builds launch plans' keys (plan_key, below) and reads the current CUDA
   context (current_context).

   attncc.runtime.native builds it with the system's C compiler; where that fails,
   attncc.runtime.driver keeps a Python implementation of the same object (and
   attncc.runtime.launch_plan of the key). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_entry)(void *function, unsigned grid_x, unsigned grid_y,
                            unsigned grid_z, unsigned block_x, unsigned block_y,
                            unsigned block_z, unsigned shared_bytes, void *stream,
                            void **params, void **extra);

typedef struct {
  Py_ssize_t at;
  int kind;
  PyObject *key; /* kind 0: a str; kind 1: an int index (as Py_ssize_t below) */
  Py_ssize_t index;
  int shift;
  uint64_t bias;
  Py_ssize_t length; /* 8: a word; otherwise the bytes of a whole map */
} Slot;

typedef struct {
  PyObject_HEAD launch_entry entry;
  void *function;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  char *buffer;
  Py_ssize_t buffer_size;
  void **params;
  Py_ssize_t n_params;
  Slot *slots;
  Py_ssize_t n_slots;
  PyThread_type_lock lock;
} Launch;

static PyObject *data_ptr_name = NULL;

/* A value's data pointer: an int as it is, None as 0, else its data_ptr(). */
static int pointer_of(PyObject *value, uint64_t *out) {
  if (PyLong_Check(value)) {
    *out = PyLong_AsUnsignedLongLongMask(value);
    return PyErr_Occurred() ? -1 : 0;
  }
  if (value == Py_None) {
    *out = 0;
    return 0;
  }
  PyObject *ptr = PyObject_CallMethodNoArgs(value, data_ptr_name);
  if (ptr == NULL) {
    return -1;
  }
  if (!PyLong_Check(ptr)) {
    Py_DECREF(ptr);
    PyErr_SetString(PyExc_TypeError, "attncc launch: data_ptr() did not return an int");
    return -1;
  }
  *out = PyLong_AsUnsignedLongLongMask(ptr);
  Py_DECREF(ptr);
  return PyErr_Occurred() ? -1 : 0;
}

static int write_slot(Launch *self, const Slot *slot, PyObject *inputs, PyObject *items,
                      PyObject *base) {
  PyObject *value = NULL;
  if (slot->kind == 0) {
    if (!PyDict_Check(inputs)) {
      PyErr_SetString(PyExc_TypeError, "attncc launch: inputs must be a dict");
      return -1;
    }
    value = PyDict_GetItemWithError(inputs, slot->key); /* borrowed */
    if (value == NULL) {
      if (!PyErr_Occurred()) {
        PyErr_SetObject(PyExc_KeyError, slot->key);
      }
      return -1;
    }
  } else if (slot->kind == 1) {
    if (PyList_Check(items)) {
      if (slot->index >= PyList_GET_SIZE(items)) goto out_of_range;
      value = PyList_GET_ITEM(items, slot->index);
    } else if (PyTuple_Check(items)) {
      if (slot->index >= PyTuple_GET_SIZE(items)) goto out_of_range;
      value = PyTuple_GET_ITEM(items, slot->index);
    } else {
      PyErr_SetString(PyExc_TypeError, "attncc launch: items must be a list or tuple");
      return -1;
    }
  } else {
    value = base;
  }
  char *target = self->buffer + slot->at;
  if (slot->length != 8) {
    char *bytes;
    Py_ssize_t length;
    if (PyBytes_AsStringAndSize(value, &bytes, &length) < 0) {
      return -1;
    }
    if (length != slot->length) {
      PyErr_Format(PyExc_ValueError, "attncc launch: a %zd-byte slot given %zd bytes",
                   slot->length, length);
      return -1;
    }
    memcpy(target, bytes, (size_t)length);
    return 0;
  }
  uint64_t pointer;
  if (pointer_of(value, &pointer) < 0) {
    return -1;
  }
  uint64_t word = slot->bias + (pointer >> slot->shift);
  memcpy(target, &word, sizeof word);
  return 0;
out_of_range:
  PyErr_SetString(PyExc_IndexError, "attncc launch: a slot's item index is out of range");
  return -1;
}

/* Write the slots and launch on `stream`: 0 with the driver's result in *code, -1 with a
   Python error set (a slot's value missing or of the wrong kind: nothing launched). */
static int launch_issue(Launch *self, void *stream, PyObject *inputs, PyObject *items,
                        PyObject *base, int *code) {
  if (self->lock == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "attncc launch: not prepared");
    return -1;
  }
  if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
  }
  for (Py_ssize_t i = 0; i < self->n_slots; ++i) {
    if (write_slot(self, &self->slots[i], inputs, items, base) < 0) {
      PyThread_release_lock(self->lock);
      return -1;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  *code = self->entry(self->function, self->grid[0], self->grid[1], self->grid[2],
                      self->block[0], self->block[1], self->block[2], self->shared_bytes,
                      stream, self->params, NULL);
  Py_END_ALLOW_THREADS
  PyThread_release_lock(self->lock);
  return 0;
}

/* run(stream, inputs, items, base) -> the driver's result code */
static PyObject *Launch_run(Launch *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "attncc launch: run(stream, inputs, items, base)");
    return NULL;
  }
  void *stream = PyLong_AsVoidPtr(args[0]);
  if (stream == NULL && PyErr_Occurred()) {
    return NULL;
  }
  int code = 0;
  if (launch_issue(self, stream, args[1], args[2], args[3], &code) < 0) {
    return NULL;
  }
  return PyLong_FromLong(code);
}

/* The packed parameters as they stand (tests read what a launch passed). */
static PyObject *Launch_buffer(Launch *self, PyObject *Py_UNUSED(ignored)) {
  return PyBytes_FromStringAndSize(self->buffer, self->buffer_size);
}

static void Launch_dealloc(Launch *self) {
  for (Py_ssize_t i = 0; i < self->n_slots; ++i) {
    Py_XDECREF(self->slots[i].key);
  }
  if (self->lock != NULL) {
    PyThread_free_lock(self->lock);
  }
  PyMem_Free(self->slots);
  PyMem_Free(self->params);
  PyMem_Free(self->buffer);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int unsigned_triple(PyObject *tuple, unsigned out[3], const char *what) {
  if (!PyArg_ParseTuple(tuple, "III", &out[0], &out[1], &out[2])) {
    PyErr_Format(PyExc_TypeError, "attncc launch: %s must be three ints", what);
    return -1;
  }
  return 0;
}

/* Launch(entry, function, grid, block, shared_bytes, params, offsets, slots):
   `params` the packed buffer, `offsets` each parameter's byte offset in it, `slots`
   (at, kind, key, shift, bias, length) tuples. */
static int Launch_init(Launch *self, PyObject *args, PyObject *kwargs) {
  unsigned long long entry, function;
  PyObject *grid, *block, *offsets, *slots;
  unsigned shared_bytes;
  Py_buffer params;
  if (!PyArg_ParseTuple(args, "KKOOIy*OO", &entry, &function, &grid, &block, &shared_bytes,
                        &params, &offsets, &slots)) {
    return -1;
  }
  int status = -1;
  PyObject *offset_seq = NULL, *slot_seq = NULL;
  if (unsigned_triple(grid, self->grid, "grid") < 0 ||
      unsigned_triple(block, self->block, "block") < 0) {
    goto done;
  }
  self->entry = (launch_entry)(uintptr_t)entry;
  self->function = (void *)(uintptr_t)function;
  self->shared_bytes = shared_bytes;
  self->buffer_size = params.len;
  self->buffer = PyMem_Malloc(params.len > 0 ? (size_t)params.len : 1);
  if (self->buffer == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  memcpy(self->buffer, params.buf, (size_t)params.len);
  offset_seq = PySequence_Fast(offsets, "attncc launch: offsets must be a sequence");
  slot_seq = PySequence_Fast(slots, "attncc launch: slots must be a sequence");
  if (offset_seq == NULL || slot_seq == NULL) {
    goto done;
  }
  self->n_params = PySequence_Fast_GET_SIZE(offset_seq);
  self->params = PyMem_Calloc((size_t)self->n_params + 1, sizeof(void *));
  if (self->params == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < self->n_params; ++i) {
    Py_ssize_t at = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(offset_seq, i));
    if (at < 0 || at >= params.len) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "attncc launch: a parameter offset past the buffer");
      }
      goto done;
    }
    self->params[i] = self->buffer + at;
  }
  self->n_slots = PySequence_Fast_GET_SIZE(slot_seq);
  self->slots = PyMem_Calloc((size_t)self->n_slots + 1, sizeof(Slot));
  if (self->slots == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < self->n_slots; ++i) {
    Slot *slot = &self->slots[i];
    PyObject *key;
    unsigned long long bias;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(slot_seq, i), "niOiKn", &slot->at,
                          &slot->kind, &key, &slot->shift, &bias, &slot->length)) {
      goto done;
    }
    slot->bias = (uint64_t)bias;
    Py_INCREF(key);
    slot->key = key;
    if (slot->kind < 0 || slot->kind > 2 || slot->shift < 0 || slot->shift > 63 ||
        slot->length < 8 || slot->at < 0 || slot->at + slot->length > params.len) {
      PyErr_SetString(PyExc_ValueError, "attncc launch: a slot outside the buffer or of no kind");
      goto done;
    }
    if (slot->kind == 0 && !PyUnicode_Check(key)) {
      PyErr_SetString(PyExc_TypeError, "attncc launch: an input slot's key must be a str");
      goto done;
    }
    if (slot->kind == 1) {
      slot->index = PyLong_AsSsize_t(key);
      if (slot->index < 0) {
        if (!PyErr_Occurred()) {
          PyErr_SetString(PyExc_ValueError, "attncc launch: a negative item index");
        }
        goto done;
      }
    }
  }
  self->lock = PyThread_allocate_lock();
  if (self->lock == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  status = 0;
done:
  Py_XDECREF(offset_seq);
  Py_XDECREF(slot_seq);
  PyBuffer_Release(&params);
  return status;
}

/* plan_key(head, tensors, params, tensor_type) -> tuple or None: attncc.runtime.launch_plan's
   Plans.key without the stream, built in one call (1.67 against 2.43 us for five tensors on
   a CPU machine: most of what is left is torch's getters). `head` (a tuple) leads; then,
   per tensor of the dict `tensors` in order, (name, shape, stride(), dtype, device,
   data_ptr() % 16); per param of the dict `params`, (name, type, value). None where a
   tensor's type is not exactly `tensor_type` or a param is not exactly an int, float or
   bool: no plan may take such a call. */
static PyObject *shape_name = NULL, *stride_name = NULL, *dtype_name = NULL,
                *device_name = NULL;

/* The key plan_key returns (a new reference), Py_None (new) where no plan may take the
   call, NULL with an error set. */
static PyObject *build_key(PyObject *head, PyObject *tensors, PyObject *params,
                           PyObject *tensor_type) {
  Py_ssize_t n_head = PyTuple_GET_SIZE(head);
  Py_ssize_t size = n_head + 6 * PyDict_GET_SIZE(tensors) + 3 * PyDict_GET_SIZE(params);
  PyObject *key = PyTuple_New(size);
  if (key == NULL) {
    return NULL;
  }
  Py_ssize_t at = 0;
  for (; at < n_head; ++at) {
    PyObject *item = PyTuple_GET_ITEM(head, at);
    Py_INCREF(item);
    PyTuple_SET_ITEM(key, at, item);
  }
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(tensors, &pos, &name, &value)) {
    if ((PyObject *)Py_TYPE(value) != tensor_type) {
      Py_DECREF(key);
      Py_RETURN_NONE;
    }
    PyObject *parts[5];
    parts[0] = PyObject_GetAttr(value, shape_name);
    parts[1] = parts[0] ? PyObject_CallMethodNoArgs(value, stride_name) : NULL;
    parts[2] = parts[1] ? PyObject_GetAttr(value, dtype_name) : NULL;
    parts[3] = parts[2] ? PyObject_GetAttr(value, device_name) : NULL;
    uint64_t pointer = 0;
    parts[4] = parts[3] && pointer_of(value, &pointer) == 0
                   ? PyLong_FromUnsignedLongLong(pointer % 16)
                   : NULL;
    Py_INCREF(name);
    PyTuple_SET_ITEM(key, at++, name);
    for (int i = 0; i < 5; ++i) {
      if (parts[i] == NULL) { /* the slots not yet set are NULL, which the tuple skips */
        for (int j = i + 1; j < 5; ++j) Py_XDECREF(parts[j]);
        Py_DECREF(key);
        return NULL;
      }
      PyTuple_SET_ITEM(key, at++, parts[i]);
    }
  }
  pos = 0;
  while (PyDict_Next(params, &pos, &name, &value)) {
    PyTypeObject *type = Py_TYPE(value);
    if (type != &PyLong_Type && type != &PyFloat_Type && type != &PyBool_Type) {
      Py_DECREF(key);
      Py_RETURN_NONE;
    }
    Py_INCREF(name);
    Py_INCREF(type);
    Py_INCREF(value);
    PyTuple_SET_ITEM(key, at++, name);
    PyTuple_SET_ITEM(key, at++, (PyObject *)type);
    PyTuple_SET_ITEM(key, at++, value);
  }
  return key;
}

static int key_arguments(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                         const char *usage) {
  if (nargs != expected || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]) ||
      !PyDict_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
  }
  return 0;
}

static PyObject *plan_key(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
  if (key_arguments(args, nargs, 4,
                    "plan_key(head: tuple, tensors: dict, params: dict, tensor_type)") < 0) {
    return NULL;
  }
  return build_key(args[0], args[1], args[2], args[3]);
}

/* current_context(address) -> the calling thread's current CUDA context (0: none, or the
   driver's error), read by libcuda's cuCtxGetCurrent at `address`: a launch plan checks it
   on every call, which through ctypes took 0.7 us of CPU (H200 host). */
typedef int (*context_entry)(void **context);

static PyObject *current_context(PyObject *Py_UNUSED(module), PyObject *address) {
  void *entry = PyLong_AsVoidPtr(address);
  if (entry == NULL) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "attncc current_context: no cuCtxGetCurrent address");
    }
    return NULL;
  }
  void *context = NULL;
  int code = ((context_entry)entry)(&context);
  return PyLong_FromUnsignedLongLong(code == 0 ? (unsigned long long)(uintptr_t)context : 0);
}

/* A launch plan replayed from C: Replay(context_entry, context, stream, allocations,
   scratch, launches, outputs, hooks, guard, check), called with a call's tensors (a dict by
   name), does what attncc.runtime.launch_plan's FusedPlan and triton_plan's TritonPlan do
   for a repeated call, without a Python frame:
     - refuses (returns None, launching nothing) where the calling thread's CUDA context,
       read through cuCtxGetCurrent at `context_entry` (0: not checked), is not `context`;
       where the attribute `name` of `owner`, for any (owner, name) pair of `hooks`, has a
       true `calls` (Triton's launch hooks: a profiler); where
       `guard`, a (callable, expected) pair or None, calls to anything but `expected`;
     - allocates: each of `allocations` is called with no arguments (a prepared allocator),
       or is kept as it is (a buffer every call shares); `scratch`, a callable or None, gives
       the block whose data pointer is the launches' `base` (anything else than a callable
       is that block, kept: a plan bound to one stream reuses its scratch);
     - issues `launches` (Launch objects, their slots filled from the tensors, the
       allocations as items and the base) on `stream`: an int, or a callable returning it;
       a result code other than 0 goes to `check(code)`, which raises;
     - returns the allocations at the indices of `outputs`, a tuple. */
typedef struct {
  PyObject_HEAD context_entry get_context;
  uint64_t context;
  PyObject *stream;
  PyObject *allocations;
  PyObject *scratch;
  PyObject *launches;
  Py_ssize_t *outputs;
  Py_ssize_t n_outputs;
  PyObject *hooks;
  PyObject *guard;
  PyObject *check;
} Replay;

static PyTypeObject LaunchType;
static PyObject *calls_name = NULL;

static void Replay_dealloc(Replay *self) {
  Py_XDECREF(self->stream);
  Py_XDECREF(self->allocations);
  Py_XDECREF(self->scratch);
  Py_XDECREF(self->launches);
  Py_XDECREF(self->hooks);
  Py_XDECREF(self->guard);
  Py_XDECREF(self->check);
  PyMem_Free(self->outputs);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Replay_init(Replay *self, PyObject *args, PyObject *kwargs) {
  unsigned long long entry, context;
  PyObject *stream, *allocations, *scratch, *launches, *outputs, *hooks, *guard, *check;
  if (!PyArg_ParseTuple(args, "KKOO!OO!O!O!OO", &entry, &context, &stream, &PyTuple_Type,
                        &allocations, &scratch, &PyTuple_Type, &launches, &PyTuple_Type,
                        &outputs, &PyTuple_Type, &hooks, &guard, &check)) {
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); ++i) {
    if (!PyObject_TypeCheck(PyTuple_GET_ITEM(launches, i), &LaunchType)) {
      PyErr_SetString(PyExc_TypeError, "attncc replay: launches must be Launch objects");
      return -1;
    }
  }
  if (guard != Py_None && !(PyTuple_Check(guard) && PyTuple_GET_SIZE(guard) == 2)) {
    PyErr_SetString(PyExc_TypeError, "attncc replay: guard must be None or (callable, expected)");
    return -1;
  }
  Py_ssize_t n_allocations = PyTuple_GET_SIZE(allocations);
  Py_ssize_t n_outputs = PyTuple_GET_SIZE(outputs);
  Py_ssize_t *indices = PyMem_Calloc((size_t)n_outputs + 1, sizeof(Py_ssize_t));
  if (indices == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n_outputs; ++i) {
    indices[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(outputs, i));
    if (indices[i] < 0 || indices[i] >= n_allocations) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_IndexError, "attncc replay: an output is not an allocation");
      }
      PyMem_Free(indices);
      return -1;
    }
  }
  PyMem_Free(self->outputs);
  self->outputs = indices;
  self->n_outputs = n_outputs;
  self->get_context = (context_entry)(uintptr_t)entry;
  self->context = (uint64_t)context;
  PyObject *held[] = {stream, allocations, scratch, launches, hooks, guard, check};
  PyObject **fields[] = {&self->stream, &self->allocations, &self->scratch, &self->launches,
                         &self->hooks, &self->guard, &self->check};
  for (int i = 0; i < 7; ++i) {
    Py_INCREF(held[i]);
    Py_XSETREF(*fields[i], held[i]);
  }
  return 0;
}

/* 1 where the replay may run here, 0 where it refuses, -1 on an error. */
static int replay_allowed(Replay *self) {
  if (self->get_context != NULL) {
    void *context = NULL;
    if (self->get_context(&context) != 0 || (uint64_t)(uintptr_t)context != self->context) {
      return 0;
    }
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->hooks); ++i) {
    PyObject *pair = PyTuple_GET_ITEM(self->hooks, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_SetString(PyExc_TypeError, "attncc replay: a hook is an (owner, name) pair");
      return -1;
    }
    PyObject *hook = PyObject_GetAttr(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
    PyObject *calls = hook ? PyObject_GetAttr(hook, calls_name) : NULL;
    Py_XDECREF(hook);
    if (calls == NULL) {
      return -1;
    }
    int set = PyObject_IsTrue(calls);
    Py_DECREF(calls);
    if (set != 0) {
      return set < 0 ? -1 : 0;
    }
  }
  if (self->guard != Py_None) {
    PyObject *now = PyObject_CallNoArgs(PyTuple_GET_ITEM(self->guard, 0));
    if (now == NULL) {
      return -1;
    }
    int same = PyObject_RichCompareBool(now, PyTuple_GET_ITEM(self->guard, 1), Py_EQ);
    Py_DECREF(now);
    return same;
  }
  return 1;
}

static PyObject *replay_run(Replay *self, PyObject *tensors) {
  int allowed = replay_allowed(self);
  if (allowed <= 0) {
    if (allowed < 0) {
      return NULL;
    }
    Py_RETURN_NONE;
  }
  void *stream;
  if (PyLong_Check(self->stream)) {
    stream = PyLong_AsVoidPtr(self->stream);
  } else {
    PyObject *value = PyObject_CallNoArgs(self->stream);
    if (value == NULL) {
      return NULL;
    }
    stream = PyLong_AsVoidPtr(value);
    Py_DECREF(value);
  }
  if (stream == NULL && PyErr_Occurred()) {
    return NULL;
  }
  PyObject *result = NULL, *block = NULL, *base = NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(self->allocations);
  PyObject *items = PyTuple_New(n);
  if (items == NULL) {
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *allocation = PyTuple_GET_ITEM(self->allocations, i);
    PyObject *made;
    if (PyCallable_Check(allocation)) {
      made = PyObject_CallNoArgs(allocation);
      if (made == NULL) {
        goto done;
      }
    } else {
      Py_INCREF(allocation);
      made = allocation;
    }
    PyTuple_SET_ITEM(items, i, made);
  }
  if (self->scratch != Py_None) {
    /* held until the launches are queued: freed before, its memory could go to the next
       allocation while the kernels still write it */
    if (PyCallable_Check(self->scratch)) {
      block = PyObject_CallNoArgs(self->scratch);
      if (block == NULL) {
        goto done;
      }
    } else {
      Py_INCREF(self->scratch);
      block = self->scratch;
    }
    base = PyObject_CallMethodNoArgs(block, data_ptr_name);
  } else {
    base = PyLong_FromLong(0);
  }
  if (base == NULL) {
    goto done;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->launches); ++i) {
    int code = 0;
    Launch *launch = (Launch *)PyTuple_GET_ITEM(self->launches, i);
    if (launch_issue(launch, stream, tensors, items, base, &code) < 0) {
      goto done;
    }
    if (code != 0) {
      PyObject *raised = PyObject_CallFunction(self->check, "i", code);
      if (raised == NULL) {
        goto done;
      }
      Py_DECREF(raised);
    }
  }
  result = PyTuple_New(self->n_outputs);
  if (result == NULL) {
    goto done;
  }
  for (Py_ssize_t i = 0; i < self->n_outputs; ++i) {
    PyObject *output = PyTuple_GET_ITEM(items, self->outputs[i]);
    Py_INCREF(output);
    PyTuple_SET_ITEM(result, i, output);
  }
done:
  Py_XDECREF(base);
  Py_XDECREF(block);
  Py_DECREF(items);
  return result;
}

static PyObject *Replay_call(Replay *self, PyObject *args, PyObject *kwargs) {
  PyObject *tensors;
  if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "attncc replay: called with the tensors alone");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &tensors)) {
    return NULL;
  }
  return replay_run(self, tensors);
}

static PyTypeObject ReplayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "attncc_launcher.Replay",
    .tp_basicsize = sizeof(Replay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A launch plan replayed from C (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Replay_init,
    .tp_dealloc = (destructor)Replay_dealloc,
    .tp_call = (ternaryfunc)Replay_call,
};

/* replay(table, head, tensors, params, tensor_type, stream_of) -> outputs or None: plan_key's
   key for (head, tensors, params), with the current stream appended (stream_of(device
   index), the last tensor's device), looked up in the dict `table`, whose values are
   Replays; the one found run on the tensors. None where the call has no key, its tensors
   are not on a CUDA device, the table has no replay of its key, or that replay refused. A
   repeated call's whole host path, once its inputs are bound. */
static PyObject *type_name = NULL, *index_name = NULL;

static PyObject *replay(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyDict_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError,
                    "replay(table: dict, head: tuple, tensors: dict, params: dict, "
                    "tensor_type, stream_of)");
    return NULL;
  }
  PyObject *table = args[0];
  if (key_arguments(args + 1, nargs - 1, 5, "replay: head a tuple, tensors and params dicts") < 0) {
    return NULL;
  }
  if (PyDict_GET_SIZE(table) == 0 || PyDict_GET_SIZE(args[2]) == 0) {
    Py_RETURN_NONE;
  }
  PyObject *key = build_key(args[1], args[2], args[3], args[4]);
  if (key == NULL || key == Py_None) {
    return key;
  }
  PyObject *result = NULL, *type = NULL, *index = NULL, *stream = NULL, *full = NULL;
  Py_ssize_t size = PyTuple_GET_SIZE(key);
  /* the last tensor's device: 6 items a tensor, the device the fifth */
  PyObject *device = PyTuple_GET_ITEM(
      key, PyTuple_GET_SIZE(args[1]) + 6 * PyDict_GET_SIZE(args[2]) - 2);
  type = PyObject_GetAttr(device, type_name);
  if (type == NULL) {
    goto done;
  }
  if (!PyUnicode_Check(type) || PyUnicode_CompareWithASCIIString(type, "cuda") != 0) {
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
  }
  index = PyObject_GetAttr(device, index_name);
  stream = index ? PyObject_CallOneArg(args[5], index) : NULL;
  full = stream ? PyTuple_New(size + 1) : NULL;
  if (full == NULL) {
    goto done;
  }
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject *item = PyTuple_GET_ITEM(key, i);
    Py_INCREF(item);
    PyTuple_SET_ITEM(full, i, item);
  }
  Py_INCREF(stream);
  PyTuple_SET_ITEM(full, size, stream);
  PyObject *found = PyDict_GetItemWithError(table, full); /* borrowed */
  if (found == NULL) {
    if (!PyErr_Occurred()) {
      Py_INCREF(Py_None);
      result = Py_None;
    }
    goto done;
  }
  if (!PyObject_TypeCheck(found, &ReplayType)) {
    PyErr_SetString(PyExc_TypeError, "replay: the table's values must be Replays");
    goto done;
  }
  Py_INCREF(found); /* the table may drop it while it runs (another thread) */
  result = replay_run((Replay *)found, args[2]);
  Py_DECREF(found);
done:
  Py_XDECREF(full);
  Py_XDECREF(stream);
  Py_XDECREF(index);
  Py_XDECREF(type);
  Py_DECREF(key);
  return result;
}

static PyMethodDef module_methods[] = {
    {"plan_key", (PyCFunction)(void (*)(void))plan_key, METH_FASTCALL,
     "plan_key(head, tensors, params, tensor_type): a launch plan's key, or None"},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(table, head, tensors, params, tensor_type, stream_of): a call replayed, or None"},
    {"current_context", (PyCFunction)current_context, METH_O,
     "current_context(address): the current CUDA context through cuCtxGetCurrent at address"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Launch_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Launch_run, METH_FASTCALL,
     "run(stream, inputs, items, base): write the slots, launch; the driver's result code"},
    {"buffer", (PyCFunction)Launch_buffer, METH_NOARGS, "the packed parameters"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "attncc_launcher.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prepared kernel launch (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_methods = Launch_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "attncc_launcher", "attncc's kernel launcher", -1, module_methods,
};

PyMODINIT_FUNC PyInit_attncc_launcher(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  shape_name = PyUnicode_InternFromString("shape");
  stride_name = PyUnicode_InternFromString("stride");
  dtype_name = PyUnicode_InternFromString("dtype");
  device_name = PyUnicode_InternFromString("device");
  calls_name = PyUnicode_InternFromString("calls");
  type_name = PyUnicode_InternFromString("type");
  index_name = PyUnicode_InternFromString("index");
  if (data_ptr_name == NULL || shape_name == NULL || stride_name == NULL ||
      dtype_name == NULL || device_name == NULL || calls_name == NULL || type_name == NULL ||
      index_name == NULL || PyType_Ready(&LaunchType) < 0 || PyType_Ready(&ReplayType) < 0) {
    return NULL;
  }
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) {
    return NULL;
  }
  Py_INCREF(&LaunchType);
  if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0) {
    Py_DECREF(&LaunchType);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&ReplayType);
  if (PyModule_AddObject(m, "Replay", (PyObject *)&ReplayType) < 0) {
    Py_DECREF(&ReplayType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
