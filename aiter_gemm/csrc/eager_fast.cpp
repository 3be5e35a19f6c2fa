// The eager entry of every registered op in C++ (aiter_gemm/op_entry.py declares and registers them,
// aiter_gemm/eager_ext.py builds and loads this file). Adding an op adds no code here.
//
// Why: building and hashing the Python cache key and the Python frames around it cost an eager call 1-6 us of host
// time on the H100 host (docs/exploration.md), about what a decode GEMM takes on the GPU. Here the key is a short
// array of integers and the cache a C++ hash map per op.
//
// An op registers its parameters (register_op: name, kind, default; per kind: a tensor, a tensor or None, a value,
// or a bypass argument) and gets a builtin function with its signature. A call binds its arguments (positional and
// keyword), builds the key from them (per tensor: dims, sizes, dtype, device, and strides where declared, or None;
// per value: None, a dtype, a bool, an int, or its index among the op's declared choices), looks it up in the op's
// map and calls what the Python path stored there (remember) for that key: a runner with the op's leading
// arguments, or, for the runner torch.nn.functional.linear, at::linear directly. Everything else goes to the op's
// Python entry, unchanged: a key not stored, a tensor subclass, a tensor carrying a declared mark such as
// is_shuffled, a value it does not key, a bypass argument not at its default, an active TorchFunctionMode where
// at::linear would run, a CUDA graph being captured for a decision whose runner differs there. The Python runtime
// stays the source of truth: it decides every new key and calls remember() for the keys its op allows. A map is
// dropped when its op's DecisionCache ``generation`` changes (reload_configs): the only attribute of the package's
// objects read here, with the public capture counter (aiter_gemm.cudagraph.capture_state.depth).
//
// The module call entry (module_call.cpp, the same extension) serves nn.Linear-like modules through one of these
// ops (eager_fast.h: what it uses of this file).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "eager_fast.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace aiter_eager {

constexpr int kMaxWords = 64;  // a call whose key would be longer goes to the Python entry

// A parameter's kind (aiter_gemm/op_entry.py KINDS).
enum Kind : int { kTensor = 0, kOptionalTensor = 1, kValue = 2, kBypass = 3 };

// (type << 8) | (index + 1) of a tensor's device: CPU, meta and each GPU apart.
inline int64_t device_code(const at::Tensor& t) {
  const c10::Device dev = t.device();
  return static_cast<uint16_t>((static_cast<int>(dev.type()) << 8) | (dev.index() + 1));
}

// The key of one call: a mask of the parameters that are None (optional tensors and values without choices), then
// the words of the others in parameter order. A tensor: (1 << 56 | ndim << 32 | device << 8 | dtype), then its
// sizes, then its strides where the parameter declares them; a value: one word by its type (two for an int). Each
// parameter's kind (and whether it keys strides) is fixed, so the words of two different calls differ.
struct Key {
  int len = 0;
  std::array<int64_t, kMaxWords> w;  // only the first len words are set (and read)
  bool operator==(const Key& o) const {
    if (len != o.len) {
      return false;
    }
    for (int i = 0; i < len; ++i) {  // keys are short: a loop beats a call to memcmp
      if (w[i] != o.w[i]) {
        return false;
      }
    }
    return true;
  }
};

// Each word times its own odd constant, summed (the multiplies are independent, so they overlap), then mixed.
struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = static_cast<uint64_t>(key.len);
    for (int i = 0; i < key.len; ++i) {
      h += static_cast<uint64_t>(key.w[i]) * (0x9E3779B97F4A7C15ULL + 2 * static_cast<uint64_t>(i));
    }
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    return static_cast<size_t>(h ^ (h >> 32));
  }
};

// A remembered decision: ``runner(*args[:runner_args])`` outside capture (and inside it when probe is null; else
// capture goes through the Python entry, which runs the capture-time runner).
struct Value {
  PyObject* runner = nullptr;  // strong
  PyObject* probe = nullptr;   // strong or null
};

// The words (and None mask bits) of a run of trailing parameters at their defaults, encoded once at registration:
// a positional call that leaves them out skips encoding them. ``ok`` false: a default this entry does not key.
struct Suffix {
  bool ok = false;
  uint64_t nones = 0;
  int len = 0;
  std::array<int64_t, kMaxWords> w{};
};

struct Param {
  PyObject* name = nullptr;     // interned (strong)
  int kind = kTensor;
  PyObject* dflt = nullptr;     // strong; null: required
  PyObject* choices = nullptr;  // a value's keyed values, a tuple (strong), or null
  PyObject* marks = nullptr;    // a tensor's mark attributes, a tuple of interned str (strong), or null
  bool strides = false;         // a tensor's strides are key words too (an op checking its layout)
};

// One registered op: its declaration, its entry function and its map, valid for one ``generation`` of its
// DecisionCache.
struct Op {
  std::string name, doc;
  PyMethodDef def{};
  PyObject* func = nullptr;  // the entry function (strong)
  std::vector<Param> params;
  std::array<PyObject*, kMaxParams> defaults{};  // params[i].dflt, contiguous: what bind() copies
  std::vector<Suffix> suffixes;                   // suffixes[k]: parameters k.. at their defaults (k >= required)
  Py_ssize_t runner_args = 0;
  Py_ssize_t required = 0;  // the leading parameters without a default (the others all have one)
  bool has_bypass = false;
  bool linear_ok = false;  // (tensor, tensor, tensor or None) leading and runner_args 3: F.linear runs as at::linear
  std::unordered_map<Key, Value, KeyHash> map;
  long generation = -1;          // the DecisionCache generation the map belongs to (-1: none yet)
  PyObject* cache = nullptr;     // the op's aiter_gemm.dispatch.DecisionCache (strong)
  PyObject* fallback = nullptr;  // the op's Python entry (strong)
};

std::vector<Op*> g_ops;         // never freed: their entry functions point at them for the process's life
PyObject* g_linear = nullptr;   // torch.nn.functional.linear (strong): a runner run as at::linear
PyObject* g_capturing = nullptr;  // aiter_gemm.cudagraph.capturing (strong): read as g_local.depth instead
PyObject* g_local = nullptr;      // aiter_gemm.cudagraph.capture_state (strong)
PyObject* g_generation_name = nullptr;
PyObject* g_depth_name = nullptr;

// torch.Tensor or nn.Parameter exactly (C++ sees no difference between them; a subclass may override anything).
inline bool is_tensor(PyObject* obj) {
  return THPVariable_CheckExact(obj);
}

PyObject* entry_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames);

PyObject* instance_dict(PyObject* obj) {
  PyObject** dictptr = _PyObject_GetDictPtr(obj);
  return dictptr == nullptr ? nullptr : *dictptr;
}

Op* op_of(PyObject* fn) {
  if (PyCFunction_Check(fn) &&
      PyCFunction_GET_FUNCTION(fn) == reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(entry_call))) {
    return static_cast<Op*>(PyCapsule_GetPointer(PyCFunction_GET_SELF(fn), nullptr));
  }
  PyErr_Format(PyExc_TypeError, "aiter_gemm eager_fast: %R is not an op entry made by register_op", fn);
  return nullptr;
}

bool takes_linear_args(const Op& op) {
  return op.params.size() >= 3 && op.params[0].kind == kTensor && op.params[1].kind == kTensor &&
         op.params[2].kind == kOptionalTensor;
}

void drop(Op& op) {
  for (auto& item : op.map) {
    Py_DECREF(item.second.runner);
    Py_XDECREF(item.second.probe);
  }
  op.map.clear();
}

// The map is valid only for the DecisionCache's current ``generation``. 0: valid; 1: stale (dropped); -1: error.
int check_token(Op& op) {
  PyObject* gen = PyObject_GetAttr(op.cache, g_generation_name);
  if (gen == nullptr) {
    return -1;
  }
  const long value = PyLong_AsLong(gen);
  Py_DECREF(gen);
  if (value == -1 && PyErr_Occurred()) {
    return -1;
  }
  if (value == op.generation) {
    return 0;
  }
  drop(op);
  op.generation = value;
  return 1;
}

// Whether this thread is capturing a CUDA graph, per the decision's probe (null: never asked). 1/0; -1: error.
int probe_says_capturing(PyObject* probe) {
  if (probe == nullptr) {
    return 0;
  }
  const bool counted = probe == g_capturing && g_local != nullptr;
  PyObject* res = counted ? PyObject_GetAttr(g_local, g_depth_name) : PyObject_CallNoArgs(probe);
  if (res == nullptr) {
    return -1;
  }
  int capturing = (counted && PyLong_Check(res)) ? (PyLong_AsLong(res) > 0) : PyObject_IsTrue(res);
  Py_DECREF(res);
  return capturing;
}

// (eager_fast.h)
Py_ssize_t bind(const Op& op, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  const Py_ssize_t n = static_cast<Py_ssize_t>(op.params.size());
  if (nargs > n) {
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    out[i] = args[i];
  }
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  if (nkw == 0) {  // positional only: the common call
    if (nargs < op.required) {
      return -1;
    }
    std::memcpy(out + nargs, op.defaults.data() + nargs, sizeof(PyObject*) * (n - nargs));
  } else {
    for (Py_ssize_t i = nargs; i < n; ++i) {
      out[i] = nullptr;
    }
    for (Py_ssize_t i = 0; i < nkw; ++i) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, i);
      Py_ssize_t j = nargs;
      while (j < n && op.params[j].name != name) {
        ++j;
      }
      if (j == n || out[j] != nullptr) {
        return -1;  // unknown, given positionally, or repeated
      }
      out[j] = args[nargs + i];
    }
    for (Py_ssize_t i = nargs; i < n; ++i) {
      if (out[i] == nullptr) {
        if (op.params[i].dflt == nullptr) {
          return -1;
        }
        out[i] = op.params[i].dflt;
      }
    }
  }
  if (op.has_bypass) {
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (op.params[i].kind == kBypass && out[i] != op.params[i].dflt) {
        return -1;
      }
    }
  }
  return nkw == 0 ? nargs : n;
}

// Whether the tensor carries one of ``marks`` as an instance attribute. 1/0; -1: error.
inline int marked(PyObject* obj, PyObject* marks) {
  PyObject* dict = instance_dict(obj);
  if (dict == nullptr) {
    return 0;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(marks); ++i) {
    if (PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(marks, i)) != nullptr) {
      return 1;
    }
    if (PyErr_Occurred()) {
      return -1;
    }
  }
  return 0;
}

// A value parameter's word(s) appended at ``w[len]``. 1: done; 0: a value this entry does not key; -1: error.
inline int push_value(const Param& p, PyObject* obj, int64_t* w, int& len) {
  if (len + 2 > kMaxWords) {
    return 0;
  }
  if (p.choices != nullptr) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(p.choices); ++i) {
      PyObject* choice = PyTuple_GET_ITEM(p.choices, i);
      int same = obj == choice;
      if (!same && Py_TYPE(obj) == Py_TYPE(choice)) {
        same = PyObject_RichCompareBool(obj, choice, Py_EQ);
        if (same < 0) {
          return -1;
        }
      }
      if (same) {
        w[len++] = (int64_t{4} << 56) | i;
        return 1;
      }
    }
    return 0;
  }
  if (THPDtype_Check(obj)) {  // (None is in the key's mask)
    w[len++] = (int64_t{1} << 56) | static_cast<int64_t>(reinterpret_cast<THPDtype*>(obj)->scalar_type);
    return 1;
  }
  if (PyBool_Check(obj)) {
    w[len++] = (int64_t{2} << 56) | (obj == Py_True ? 1 : 0);
    return 1;
  }
  if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) {
      return -1;
    }
    if (overflow != 0) {
      return 0;
    }
    w[len++] = int64_t{3} << 56;
    w[len++] = v;
    return 1;
  }
  return 0;
}

// The words of parameters [from, to) of a bound call appended at ``w[len]``, their None bits in ``nones``. 1: done;
// 0: a call this entry does not serve; -1: error.
int encode(const Op& op, PyObject* const* bound, size_t from, size_t to, int64_t* w, int& len, uint64_t& nones) {
  const Param* params = op.params.data();
  for (size_t i = from; i < to; ++i) {
    const Param& p = params[i];
    PyObject* obj = bound[i];
    if (p.kind == kBypass) {
      continue;
    }
    if (obj == Py_None && p.kind != kTensor && p.choices == nullptr) {
      nones |= uint64_t{1} << i;
      continue;
    }
    if (p.kind == kValue) {
      const int pushed = push_value(p, obj, w, len);
      if (pushed <= 0) {
        return pushed;
      }
      continue;
    }
    if (!is_tensor(obj)) {
      return 0;
    }
    if (p.marks != nullptr) {
      const int m = marked(obj, p.marks);
      if (m != 0) {
        return m < 0 ? -1 : 0;
      }
    }
    const at::Tensor& t = THPVariable_Unpack(obj);
    const c10::IntArrayRef sizes = t.sizes();
    const int64_t nd = static_cast<int64_t>(sizes.size());
    if (len + 1 + (p.strides ? 2 : 1) * nd > kMaxWords) {
      return 0;
    }
    w[len++] = (int64_t{1} << 56) | (nd << 32) | (device_code(t) << 8) |
               static_cast<int64_t>(static_cast<uint8_t>(t.scalar_type()));
    for (const int64_t s : sizes) {
      w[len++] = s;
    }
    if (p.strides) {
      for (const int64_t s : t.strides()) {
        w[len++] = s;
      }
    }
  }
  return 1;
}

// The key of a bound call whose first ``given`` parameters came from the call (the rest are their defaults). 1:
// built; 0: a call this entry does not serve; -1: error.
inline int make_key(const Op& op, PyObject* const* bound, Py_ssize_t given, Key& key) {
  int len = 1;
  uint64_t nones = 0;
  const int done = encode(op, bound, 0, static_cast<size_t>(given), key.w.data(), len, nones);
  if (done <= 0) {
    return done;
  }
  if (given < static_cast<Py_ssize_t>(op.params.size())) {
    const Suffix& rest = op.suffixes[given];
    if (!rest.ok || len + rest.len > kMaxWords) {
      return 0;
    }
    for (int j = 0; j < rest.len; ++j) {
      key.w[len++] = rest.w[j];
    }
    nones |= rest.nones;
  }
  key.w[0] = static_cast<int64_t>(nones);
  key.len = len;
  return 1;
}

// at::linear(args[0], args[1], args[2] or nothing): what F.linear runs. F.linear's binding releases the GIL around
// it; a CUDA call only enqueues work (microseconds), so it keeps the GIL and skips the release and re-acquire; a
// CPU call computes the product, so it lets other threads run meanwhile, as F.linear does.
PyObject* run_linear(PyObject* const* args) {
  const at::Tensor& a = THPVariable_Unpack(args[0]);
  const at::Tensor& w = THPVariable_Unpack(args[1]);
  const bool has_bias = args[2] != Py_None;
  if (a.is_cuda()) {
    return THPVariable_Wrap(has_bias ? at::linear(a, w, THPVariable_Unpack(args[2])) : at::linear(a, w));
  }
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    out = has_bias ? at::linear(a, w, THPVariable_Unpack(args[2])) : at::linear(a, w);
  }
  return THPVariable_Wrap(std::move(out));
}

// (eager_fast.h)
PyObject* serve(Op& op, PyObject* const* bound, Py_ssize_t given) {
  if (check_token(op) != 0) {
    return nullptr;
  }
  Key key;
  if (make_key(op, bound, given, key) <= 0) {
    return nullptr;
  }
  auto it = op.map.find(key);
  if (it == op.map.end()) {
    return nullptr;
  }
  PyObject* runner = it->second.runner;
  PyObject* probe = it->second.probe;  // both held across the calls below: a reload inside them drops the map
  Py_XINCREF(probe);
  PyObject* out = nullptr;
  if (runner == g_linear && op.linear_ok) {  // g_linear is held by this module
    // at::linear would bypass an active TorchFunctionMode, which F.linear hands the call to: the Python entry runs it
    if (!at::impl::torch_function_mode_enabled() && probe_says_capturing(probe) == 0) {
      out = run_linear(bound);
    }
  } else {
    Py_INCREF(runner);
    if (probe_says_capturing(probe) == 0) {
      out = PyObject_Vectorcall(runner, bound, op.runner_args, nullptr);
    }
    Py_DECREF(runner);
  }
  Py_XDECREF(probe);
  return out;
}

// Every op's entry function: a remembered decision served here, every other call handed to the op's Python entry.
PyObject* entry_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  Op* op = static_cast<Op*>(PyCapsule_GetPointer(self, nullptr));
  if (op == nullptr) {
    return nullptr;
  }
  PyObject* bound[kMaxParams];
  const Py_ssize_t given = bind(*op, args, PyVectorcall_NARGS(nargsf), kwnames, bound);
  if (given >= 0) {
    PyObject* out = serve(*op, bound, given);
    if (out != nullptr || PyErr_Occurred()) {
      return out;
    }
  }
  PyObject* fallback = op->fallback;
  Py_INCREF(fallback);
  PyObject* out = PyObject_Vectorcall(fallback, args, nargsf, kwnames);
  Py_DECREF(fallback);
  return out;
  END_HANDLE_TH_ERRORS
}

// remember(entry, runner, probe, *args) -> bool: calls of ``entry`` with these arguments' key run
// ``runner(*args[:runner_args])`` (always, or while probe() is false). False when the call is not one this entry
// serves (a tensor subclass, a marked tensor, a value it does not key...). Called by the Python path after it
// validated the arguments and decided the key.
PyObject* remember(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs < 3 || !PyCallable_Check(args[1]) || (args[2] != Py_None && !PyCallable_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError,
                    "aiter_gemm eager_fast.remember(entry, runner, probe, *args): runner callable, probe None or "
                    "callable");
    return nullptr;
  }
  Op* op = op_of(args[0]);
  if (op == nullptr) {
    return nullptr;
  }
  PyObject* bound[kMaxParams];
  const Py_ssize_t given = bind(*op, args + 3, nargs - 3, nullptr, bound);
  if (given < 0) {
    Py_RETURN_FALSE;
  }
  if (check_token(*op) < 0) {
    return nullptr;
  }
  Key key;
  const int made = make_key(*op, bound, given, key);
  if (made <= 0) {
    if (made < 0) {
      return nullptr;
    }
    Py_RETURN_FALSE;
  }
  Value value{args[1], args[2] == Py_None ? nullptr : args[2]};
  Py_INCREF(value.runner);
  Py_XINCREF(value.probe);
  auto it = op->map.find(key);
  if (it != op->map.end()) {
    std::swap(it->second, value);
    Py_DECREF(value.runner);
    Py_XDECREF(value.probe);
  } else {
    Key stored{};  // the unused tail zeroed: the stored key is copied whole
    stored.len = key.len;
    std::memcpy(stored.w.data(), key.w.data(), sizeof(int64_t) * key.len);
    op->map.emplace(stored, value);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

bool parse_param(PyObject* spec, Param& p) {
  PyObject *name, *choices, *marks, *dflt;
  int kind, has_default, strides;
  if (!PyTuple_Check(spec) ||
      !PyArg_ParseTuple(spec, "UipOOOp", &name, &kind, &has_default, &dflt, &choices, &marks, &strides)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.register_op: a parameter is a tuple");
    }
    return false;
  }
  if (kind < kTensor || kind > kBypass || (choices != Py_None && !PyTuple_Check(choices)) ||
      (marks != Py_None && !PyTuple_Check(marks)) || (kind == kBypass && !has_default) ||
      (strides && kind != kTensor && kind != kOptionalTensor)) {
    PyErr_Format(PyExc_ValueError,
                 "aiter_gemm eager_fast.register_op: parameter %R: bad kind, choices, marks or strides", name);
    return false;
  }
  Py_INCREF(name);
  PyUnicode_InternInPlace(&name);
  p.name = name;
  p.kind = kind;
  p.dflt = has_default ? (Py_INCREF(dflt), dflt) : nullptr;
  p.choices = choices == Py_None ? nullptr : (Py_INCREF(choices), choices);
  p.strides = strides != 0;
  p.marks = nullptr;
  if (marks != Py_None && PyTuple_GET_SIZE(marks) > 0) {
    const Py_ssize_t n = PyTuple_GET_SIZE(marks);
    p.marks = PyTuple_New(n);
    if (p.marks == nullptr) {
      return false;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* mark = PyTuple_GET_ITEM(marks, i);
      if (!PyUnicode_Check(mark)) {
        PyErr_Format(PyExc_TypeError, "aiter_gemm eager_fast.register_op: parameter %R: marks are str", name);
        return false;
      }
      Py_INCREF(mark);
      PyUnicode_InternInPlace(&mark);
      PyTuple_SET_ITEM(p.marks, i, mark);
    }
  }
  return true;
}

void release(std::vector<Param>& params) {
  for (Param& p : params) {
    Py_XDECREF(p.name);
    Py_XDECREF(p.dflt);
    Py_XDECREF(p.choices);
    Py_XDECREF(p.marks);
  }
  params.clear();
}

// register_op(name, module, params, runner_args, cache, fallback, doc) -> the op's entry function. ``params``: per
// parameter in signature order (name, kind, has_default, default, choices, marks, strides); ``cache``: the op's
// DecisionCache (its ``generation`` validates the map); ``fallback``: the op's Python entry. Registering a name
// again replaces that op's declaration, cache and fallback (its map dropped) and returns the same function.
PyObject* register_op(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1]) || !PyTuple_Check(args[2]) ||
      !PyLong_Check(args[3]) || !PyCallable_Check(args[5]) || !PyUnicode_Check(args[6])) {
    PyErr_SetString(PyExc_TypeError,
                    "aiter_gemm eager_fast.register_op(name: str, module: str, params: tuple, runner_args: int, "
                    "cache, fallback: callable, doc: str)");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args[2]);
  const Py_ssize_t runner_args = PyLong_AsSsize_t(args[3]);
  if (n > kMaxParams || runner_args < 0 || runner_args > n) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_ValueError, "aiter_gemm eager_fast.register_op: at most %d parameters, runner_args <= them",
                   kMaxParams);
    }
    return nullptr;
  }
  std::vector<Param> params(static_cast<size_t>(n));
  Py_ssize_t required = 0;
  bool has_bypass = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!parse_param(PyTuple_GET_ITEM(args[2], i), params[i])) {
      release(params);
      return nullptr;
    }
    has_bypass = has_bypass || params[i].kind == kBypass;
    if (params[i].dflt == nullptr) {
      if (required != i) {
        PyErr_Format(PyExc_ValueError, "aiter_gemm eager_fast.register_op: parameter %R without a default follows "
                     "one with a default", params[i].name);
        release(params);
        return nullptr;
      }
      required = i + 1;
    }
  }
  const char* name = PyUnicode_AsUTF8(args[0]);
  const char* doc = PyUnicode_AsUTF8(args[6]);
  if (name == nullptr || doc == nullptr) {
    release(params);
    return nullptr;
  }
  Op* op = nullptr;
  for (Op* o : g_ops) {
    if (o->name == name) {
      op = o;
    }
  }
  if (op == nullptr) {
    op = new Op();
    op->name = name;
  }
  drop(*op);
  release(op->params);
  op->params = std::move(params);
  for (Py_ssize_t i = 0; i < n; ++i) {
    op->defaults[i] = op->params[i].dflt;
  }
  op->suffixes.assign(static_cast<size_t>(n), Suffix{});
  for (Py_ssize_t k = required; k < n; ++k) {
    Suffix& rest = op->suffixes[k];
    rest.ok = encode(*op, op->defaults.data(), static_cast<size_t>(k), static_cast<size_t>(n), rest.w.data(),
                     rest.len, rest.nones) > 0;
    PyErr_Clear();  // a default the entry cannot key: calls leaving it out go to the Python entry
  }
  op->runner_args = runner_args;
  op->required = required;
  op->has_bypass = has_bypass;
  op->linear_ok = runner_args == 3 && takes_linear_args(*op);
  op->generation = -1;
  Py_INCREF(args[4]);
  Py_XSETREF(op->cache, args[4]);
  Py_INCREF(args[5]);
  Py_XSETREF(op->fallback, args[5]);
  op->doc = doc;
  op->def.ml_name = op->name.c_str();
  op->def.ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(entry_call));
  op->def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
  op->def.ml_doc = op->doc.c_str();
  if (op->func == nullptr) {
    PyObject* capsule = PyCapsule_New(op, nullptr, nullptr);
    if (capsule == nullptr) {
      return nullptr;  // op stays unregistered (and unreachable)
    }
    op->func = PyCFunction_NewEx(&op->def, capsule, args[1]);
    Py_DECREF(capsule);
    if (op->func == nullptr) {
      return nullptr;
    }
    g_ops.push_back(op);
  }
  Py_INCREF(op->func);
  return op->func;
}

// cached(entry=None) -> int: how many decisions the entry's map holds (every op's without one; tests).
PyObject* cached(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.cached(entry=None)");
    return nullptr;
  }
  if (nargs == 1 && args[0] != Py_None) {
    Op* op = op_of(args[0]);
    return op == nullptr ? nullptr : PyLong_FromSize_t(op->map.size());
  }
  size_t total = 0;
  for (const Op* op : g_ops) {
    total += op->map.size();
  }
  return PyLong_FromSize_t(total);
}

// setup(capturing, capture_state, linear): the public capture counter cudagraph.capturing reads, and
// torch.nn.functional.linear (a remembered runner that is this object runs as at::linear).
PyObject* setup(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.setup(capturing, capture_state, linear)");
    return nullptr;
  }
  PyObject** slots[] = {&g_capturing, &g_local, &g_linear};
  for (int i = 0; i < 3; ++i) {
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  Py_RETURN_NONE;
}

#define AITER_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn))

PyMethodDef kMethods[] = {
    {"register_op", AITER_FASTCALL(register_op), METH_FASTCALL,
     "register_op(name, module, params, runner_args, cache, fallback, doc) -> the op's entry function"},
    {"remember", AITER_FASTCALL(remember), METH_FASTCALL,
     "remember(entry, runner, probe, *args) -> bool: calls with these arguments' key run runner (probe: None, or a "
     "capture probe)"},
    {"cached", AITER_FASTCALL(cached), METH_FASTCALL, "cached(entry=None) -> int: decisions held (every op's)"},
    {"setup", AITER_FASTCALL(setup), METH_FASTCALL, "setup(capturing, capture_state, linear)"},
    {nullptr, nullptr, 0, nullptr}};

#define AITER_STR_(x) #x
#define AITER_STR(x) AITER_STR_(x)
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, AITER_STR(TORCH_EXTENSION_NAME), nullptr, -1, kMethods};

}  // namespace aiter_eager

#define AITER_CONCAT_(a, b) a##b
#define AITER_CONCAT(a, b) AITER_CONCAT_(a, b)

PyMODINIT_FUNC AITER_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  using namespace aiter_eager;
  g_generation_name = PyUnicode_InternFromString("generation");
  g_depth_name = PyUnicode_InternFromString("depth");
  if (!g_generation_name || !g_depth_name) {
    return nullptr;
  }
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr || !init_module_call(module) || !init_triton_launch(module) ||
      !init_tensor_map(module)) {
    Py_XDECREF(module);
    return nullptr;
  }
  return module;
}
