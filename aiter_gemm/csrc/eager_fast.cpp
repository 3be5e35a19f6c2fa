// The eager hot path of gemm_a16w16 and TunedLinear in C++ (aiter_gemm/eager_ext.py builds and loads it).
//
// Why: an eager call whose decision is plain F.linear spent 1.1-2.3 us in our Python wrapper on the H100 host, where
// F.linear takes ~15 us per call, and a 0.97x bar leaves 0.45 us; building and hashing the Python cache key (a
// 9-tuple of shapes and dtypes) is a large part of it. Here the key is a struct of integers, the cache a C++ hash
// map holding only plain decisions, and the GEMM at::linear (what F.linear calls).
//
// The Python runtime stays the source of truth: it decides every new shape (aiter_gemm/ops/a16w16.py _fast_miss)
// and, for the keys its one rule (c_servable) allows, calls remember() so this map accelerates the op's decision
// cache (aiter_gemm.dispatch.DecisionCache): the same key (Key mirrors ops/a16w16.py call_key), looked up here.
// Everything else (a first call, a non-plain decision, extra arguments, tensor subclasses, an active
// TorchFunctionMode, a weight marked is_shuffled, a CUDA graph being captured for a decision that differs there)
// goes to the Python path, which behaves as before. The map is dropped when the cache's public ``generation``
// changes (reload_configs): the only attribute of the package's objects read here, with the public capture counter
// (aiter_gemm.cudagraph.capture_state.depth).
//
// gemm_a8w8_blockscale has a second map, for every decision of that op: its key (the four operands' shapes, dtypes
// and devices, and the output dtype) is the Python key's content, and its value the runner the Python path would
// call outside capture (torch's block-scaled matmul bound to the shape, or a Triton launcher). On the H100 host
// (held-out run 5) the Python key and frames cost the op 2-6 us per eager call against torch's own call.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>

namespace {

constexpr int kMaxDims = 8;

// (type << 8) | (index + 1) of a tensor's device: CPU, meta and each GPU apart.
inline int16_t device_code(const at::Tensor& t) {
  const c10::Device dev = t.device();
  return static_cast<int16_t>((static_cast<int>(dev.type()) << 8) | (dev.index() + 1));
}

// What gemm_a16w16's Python key holds for a call without otype and scales: shapes, dtypes and devices of A, the
// weight and the bias (a call whose operands would fail the Python checks, a meta weight after a CPU one say, must
// not find a cached entry).
struct Key {
  std::array<int64_t, kMaxDims> a{};
  int64_t n = 0, k = 0, bias_n = -1;
  int16_t a_dtype = 0, w_dtype = 0, bias_dtype = -1;
  int16_t a_dev = 0, w_dev = 0, bias_dev = -1;
  int8_t ndim = 0;
  bool operator==(const Key& o) const {
    return a == o.a && n == o.n && k == o.k && bias_n == o.bias_n && a_dtype == o.a_dtype && w_dtype == o.w_dtype &&
           bias_dtype == o.bias_dtype && a_dev == o.a_dev && w_dev == o.w_dev && bias_dev == o.bias_dev &&
           ndim == o.ndim;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
    for (int i = 0; i < key.ndim; ++i) {
      mix(static_cast<uint64_t>(key.a[i]));
    }
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix(static_cast<uint64_t>(key.bias_n));
    mix((static_cast<uint64_t>(key.a_dtype) << 32) ^ (static_cast<uint64_t>(key.w_dtype) << 16) ^
        static_cast<uint64_t>(static_cast<uint16_t>(key.bias_dtype)) ^ (static_cast<uint64_t>(key.ndim) << 48));
    mix((static_cast<uint64_t>(static_cast<uint16_t>(key.a_dev)) << 32) ^
        (static_cast<uint64_t>(static_cast<uint16_t>(key.w_dev)) << 16) ^
        static_cast<uint64_t>(static_cast<uint16_t>(key.bias_dev)));
    return static_cast<size_t>(h);
  }
};

// A plain decision: always F.linear (probe null), or F.linear unless ``probe()`` says a CUDA graph is being
// captured (the decision's graph-time runner then runs, through the Python path).
struct Plain {
  PyObject* probe = nullptr;  // strong reference or null
};

// A blockscale call: (XQ, WQ, x_scale, w_scale) 2-D, their dtypes and devices, and the output dtype.
struct BlockKey {
  std::array<int64_t, 8> sizes{};
  std::array<int16_t, 5> dtypes{};  // XQ, WQ, x_scale, w_scale, out
  std::array<int16_t, 4> devices{};  // (type << 8) | (index + 1) of each operand
  bool operator==(const BlockKey& o) const {
    return sizes == o.sizes && dtypes == o.dtypes && devices == o.devices;
  }
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const {
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
    for (int64_t v : key.sizes) {
      mix(static_cast<uint64_t>(v));
    }
    for (int16_t v : key.dtypes) {
      mix(static_cast<uint64_t>(static_cast<uint16_t>(v)));
    }
    for (int16_t v : key.devices) {
      mix(static_cast<uint64_t>(static_cast<uint16_t>(v)));
    }
    return static_cast<size_t>(h);
  }
};

// A blockscale decision: ``runner(XQ, WQ, x_scale, w_scale, dtype)`` outside capture (and inside it when probe is
// null; else capture goes through the Python path, which runs the graph-time runner).
struct Runner {
  PyObject* runner = nullptr;  // strong
  PyObject* probe = nullptr;   // strong or null
};

// One op's accelerated cache, valid for one ``generation`` of the op's DecisionCache.
template <class K, class V, class H>
struct Table {
  std::unordered_map<K, V, H> map;
  long generation = -1;          // the DecisionCache generation the map belongs to (-1: none yet)
  PyObject* cache = nullptr;     // the op's aiter_gemm.dispatch.DecisionCache (strong)
  PyObject* fallback = nullptr;  // the op's Python entry (strong)
};

Table<Key, Plain, KeyHash> g_plain;
Table<BlockKey, Runner, BlockKeyHash> g_block;
PyObject* g_capturing = nullptr;   // aiter_gemm.cudagraph.capturing (strong): read as g_local.depth instead
PyObject* g_local = nullptr;       // aiter_gemm.cudagraph.capture_state (strong)
PyObject* g_generation_name = nullptr;
PyObject* g_depth_name = nullptr;
PyObject* g_params_name = nullptr;
PyObject* g_weight_name = nullptr;
PyObject* g_bias_name = nullptr;
PyObject* g_shuffled_name = nullptr;
PyObject* g_dtype_name = nullptr;
PyObject* g_config_name = nullptr;
PyObject* g_forward_name = nullptr;
PyObject* g_compiled_name = nullptr;
// The hook stores nn.Module.__call__ looks at, as aiter_gemm/nn.py found and checked them on this torch at set-up
// (their names in each module's dict, and torch's global dicts; strong, set by setup_call).
constexpr int kMaxHookDicts = 16;
int g_hook_count = 0;
PyObject* g_hook_names[kMaxHookDicts] = {};
PyObject* g_global_hooks[kMaxHookDicts] = {};

// torch.Tensor or nn.Parameter exactly (C++ sees no difference between them; a subclass may override anything).
inline bool is_tensor(PyObject* obj) {
  return THPVariable_CheckExact(obj);
}

void release(Plain& v) {
  Py_XDECREF(v.probe);
}

void release(Runner& v) {
  Py_XDECREF(v.runner);
  Py_XDECREF(v.probe);
}

template <class T>
void drop(T& table) {
  for (auto& item : table.map) {
    release(item.second);
  }
  table.map.clear();
}

// Put ``value`` (its references already taken) under ``key``, releasing what was there.
template <class T, class K, class V>
void store(T& table, const K& key, V value) {
  auto it = table.map.find(key);
  if (it != table.map.end()) {
    release(it->second);
    it->second = value;
  } else {
    table.map.emplace(key, value);
  }
}

// The map is valid only for the DecisionCache's current ``generation``. 0: valid; 1: stale (dropped); -1: error.
template <class T>
int check_token(T& table) {
  if (table.cache == nullptr) {
    return 1;
  }
  PyObject* gen = PyObject_GetAttr(table.cache, g_generation_name);
  if (gen == nullptr) {
    return -1;
  }
  const long value = PyLong_AsLong(gen);
  Py_DECREF(gen);
  if (value == -1 && PyErr_Occurred()) {
    return -1;
  }
  if (value == table.generation) {
    return 0;
  }
  drop(table);
  table.generation = value;
  return 1;
}

// Whether this thread is capturing a CUDA graph, per the decision's probe (null: never asked). 1/0; -1: error.
int probe_says_capturing(PyObject* probe) {
  if (probe == nullptr) {
    return 0;
  }
  const bool counted = probe == g_capturing && g_local != nullptr;
  Py_INCREF(probe);  // held across the call, as the runner is
  PyObject* res = counted ? PyObject_GetAttr(g_local, g_depth_name) : PyObject_CallNoArgs(probe);
  Py_DECREF(probe);
  if (res == nullptr) {
    return -1;
  }
  int capturing = (counted && PyLong_Check(res)) ? (PyLong_AsLong(res) > 0) : PyObject_IsTrue(res);
  Py_DECREF(res);
  return capturing;
}

std::optional<Key> make_key(const at::Tensor& a, const at::Tensor& w, const at::Tensor* bias) {
  const int64_t nd = a.dim();
  if (nd < 1 || nd > kMaxDims || w.dim() != 2 || (bias != nullptr && bias->dim() != 1)) {
    return std::nullopt;
  }
  Key key;
  auto sizes = a.sizes();
  for (int64_t i = 0; i < nd; ++i) {
    key.a[i] = sizes[i];
  }
  key.ndim = static_cast<int8_t>(nd);
  key.n = w.size(0);
  key.k = w.size(1);
  key.a_dtype = static_cast<int16_t>(a.scalar_type());
  key.w_dtype = static_cast<int16_t>(w.scalar_type());
  key.a_dev = device_code(a);
  key.w_dev = device_code(w);
  if (bias != nullptr) {
    key.bias_n = bias->size(0);
    key.bias_dtype = static_cast<int16_t>(bias->scalar_type());
    key.bias_dev = device_code(*bias);
  }
  return key;
}

// 1: run F.linear now; 0: not a cached plain decision (or capturing); -1: Python error.
int lookup_plain(const at::Tensor& a, const at::Tensor& w, const at::Tensor* bias) {
  if (at::impl::torch_function_mode_enabled()) {
    return 0;  // F.linear would hand the call to the mode; the Python path calls F.linear
  }
  int stale = check_token(g_plain);
  if (stale != 0) {
    return stale < 0 ? -1 : 0;
  }
  auto key = make_key(a, w, bias);
  if (!key) {
    return 0;
  }
  auto it = g_plain.map.find(*key);
  if (it == g_plain.map.end()) {
    return 0;
  }
  int capturing = probe_says_capturing(it->second.probe);
  if (capturing < 0) {
    return -1;
  }
  return capturing ? 0 : 1;
}

// F.linear's binding releases the GIL around at::linear. A CUDA call only enqueues work (microseconds), so it keeps
// the GIL and skips the release and re-acquire; a CPU call computes the product, so it lets other threads run
// meanwhile, as F.linear does.
PyObject* run_linear(const at::Tensor& a, const at::Tensor& w, const at::Tensor* bias) {
  if (a.is_cuda()) {
    return THPVariable_Wrap(bias != nullptr ? at::linear(a, w, *bias) : at::linear(a, w));
  }
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    out = bias != nullptr ? at::linear(a, w, *bias) : at::linear(a, w);
  }
  return THPVariable_Wrap(std::move(out));
}

// The instance dict of ``obj`` (borrowed), or nullptr.
inline PyObject* instance_dict(PyObject* obj) {
  PyObject** dictptr = _PyObject_GetDictPtr(obj);
  return dictptr == nullptr ? nullptr : *dictptr;
}

// A weight marked is_shuffled (an instance attribute) is keyed apart by the Python path. -1: error.
int is_shuffled(PyObject* weight) {
  PyObject* dict = instance_dict(weight);
  if (dict == nullptr) {
    return 0;
  }
  PyObject* v = PyDict_GetItemWithError(dict, g_shuffled_name);
  if (v == nullptr) {
    return PyErr_Occurred() ? -1 : 0;
  }
  return 1;
}

// The one plain path both entries share: F.linear(a, w, bias) when the operands are tensors (or Parameters) and
// their call is a cached plain decision. nullptr with no error set: not that case (the caller's Python path runs);
// nullptr with an error set: a Python error.
PyObject* run_if_plain(PyObject* a_obj, PyObject* w_obj, PyObject* bias_obj) {
  if (!is_tensor(a_obj) || !is_tensor(w_obj) || (bias_obj != Py_None && !is_tensor(bias_obj)) ||
      is_shuffled(w_obj) != 0) {
    return nullptr;
  }
  const at::Tensor& a = THPVariable_Unpack(a_obj);
  const at::Tensor& w = THPVariable_Unpack(w_obj);
  const at::Tensor* b = bias_obj == Py_None ? nullptr : &THPVariable_Unpack(bias_obj);
  return lookup_plain(a, w, b) > 0 ? run_linear(a, w, b) : nullptr;
}

// gemm_a16w16(A, B, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None)
PyObject* gemm_a16w16(PyObject* /*self*/, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  if (g_plain.fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "aiter_gemm eager_fast: setup() was not called");
    return nullptr;
  }
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  bool simple = kwnames == nullptr && nargs >= 2 && nargs <= 7;
  for (Py_ssize_t i = 3; simple && i < nargs; ++i) {
    simple = args[i] == Py_None;  // otype and scales: only the plain call is cached
  }
  if (simple) {
    PyObject* out = run_if_plain(args[0], args[1], nargs > 2 ? args[2] : Py_None);
    if (out != nullptr || PyErr_Occurred()) {
      return out;
    }
  }
  return PyObject_Vectorcall(g_plain.fallback, args, nargsf, kwnames);
  END_HANDLE_TH_ERRORS
}

// The cached plain F.linear on input of the module whose instance dict is ``dict`` (an nn.Linear-like object: weight
// and bias in its ``_parameters``), or nullptr (error set or not: see run_if_plain).
PyObject* linear_of(PyObject* dict, PyObject* input) {
  PyObject* params = dict == nullptr ? nullptr : PyDict_GetItemWithError(dict, g_params_name);  // borrowed
  PyObject* weight = params != nullptr && PyDict_Check(params) ? PyDict_GetItemWithError(params, g_weight_name)
                                                              : nullptr;  // borrowed
  // bias absent from the parameter dict: not nn.Linear-like (the Python path reads the attribute)
  PyObject* bias = weight != nullptr ? PyDict_GetItemWithError(params, g_bias_name) : nullptr;
  return bias != nullptr ? run_if_plain(input, weight, bias) : nullptr;
}

// linear(module, input) -> Tensor | None: a TunedLinear call whose decision is cached plain F.linear, else None.
PyObject* linear(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.linear(module, input) takes 2 arguments");
    return nullptr;
  }
  PyObject* out = linear_of(instance_dict(args[0]), args[1]);
  if (out != nullptr || PyErr_Occurred()) {
    return out;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// Whether nn.Module.__call__ on the module whose instance dict is ``dict`` would go straight to forward: no hooks
// (its own hook stores and torch's global ones, those setup_call named, empty), forward not replaced on the instance, no
// Module.compile() wrapper, no torch.jit trace running. 1/0; -1: error.
int bare_module_call(PyObject* dict) {
  if (g_hook_count == 0) {
    return 0;  // setup_call() not called: Module.__call__ decides
  }
  for (int i = 0; i < g_hook_count; ++i) {
    if (PyDict_GET_SIZE(g_global_hooks[i]) != 0) {
      return 0;
    }
  }
  for (int i = 0; i < g_hook_count; ++i) {
    PyObject* name = g_hook_names[i];
    PyObject* hooks = PyDict_GetItemWithError(dict, name);  // borrowed
    if (hooks == nullptr) {
      return PyErr_Occurred() ? -1 : 0;  // not a regular module: Module.__call__ decides
    }
    if (!PyDict_Check(hooks) || PyDict_GET_SIZE(hooks) != 0) {
      return 0;
    }
  }
  if (PyDict_GetItemWithError(dict, g_forward_name) != nullptr) {
    return 0;
  }
  if (PyErr_Occurred()) {
    return -1;
  }
  PyObject* compiled = PyDict_GetItemWithError(dict, g_compiled_name);  // borrowed; a class attribute otherwise
  if (compiled == nullptr && PyErr_Occurred()) {
    return -1;
  }
  if (compiled != nullptr && compiled != Py_None) {
    return 0;
  }
  return torch::jit::tracer::isTracing() ? 0 : 1;
}

// call(module, input) -> Tensor | None: ``module(input)`` for a TunedLinear whose call nn.Module.__call__ would hand
// straight to forward (bare_module_call) and whose decision is cached plain F.linear; else None (the caller runs
// nn.Module.__call__). Module.__call__ spends two Python frames and eight hook checks before forward.
PyObject* call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.call(module, input) takes 2 arguments");
    return nullptr;
  }
  PyObject* dict = instance_dict(args[0]);
  if (dict == nullptr) {
    Py_RETURN_NONE;
  }
  const int bare = bare_module_call(dict);
  if (bare < 0) {
    return nullptr;
  }
  PyObject* out = bare ? linear_of(dict, args[1]) : nullptr;
  if (out != nullptr || PyErr_Occurred()) {
    return out;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// setup_call(names, global_dicts): the hook stores nn.Module.__call__ looks at, as aiter_gemm/nn.py found them in
// this torch and checked them against those it knows (call_internals_error): their names in a module's instance
// dict, and torch's global dicts of the same kinds (filled in place when hooks are registered). Until it is called,
// call() always returns None.
PyObject* setup_call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1]) || PyTuple_GET_SIZE(args[0]) < 1 ||
      PyTuple_GET_SIZE(args[0]) > kMaxHookDicts) {
    PyErr_SetString(PyExc_TypeError,
                    "aiter_gemm eager_fast.setup_call(names, global_dicts): two tuples of one length (1 to 16)");
    return nullptr;
  }
  const int n = static_cast<int>(PyTuple_GET_SIZE(args[0]));
  for (int i = 0; i < n; ++i) {
    if (!PyUnicode_Check(PyTuple_GET_ITEM(args[0], i)) || !PyDict_Check(PyTuple_GET_ITEM(args[1], i))) {
      PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.setup_call: names must be str, hook stores dicts");
      return nullptr;
    }
  }
  for (int i = 0; i < g_hook_count; ++i) {
    Py_CLEAR(g_hook_names[i]);
    Py_CLEAR(g_global_hooks[i]);
  }
  for (int i = 0; i < n; ++i) {
    PyObject* name = PyTuple_GET_ITEM(args[0], i);
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    g_hook_names[i] = name;
    PyObject* hooks = PyTuple_GET_ITEM(args[1], i);
    Py_INCREF(hooks);
    g_global_hooks[i] = hooks;
  }
  g_hook_count = n;
  Py_RETURN_NONE;
}

// remember(A, B, bias, probe): gemm_a16w16(A, B, bias) (no otype, no scales) runs plain F.linear eagerly, always
// (probe None) or while probe() is false. Called by the Python path right after it decided the shape.
PyObject* remember(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.remember(A, B, bias, probe) takes 4 arguments");
    return nullptr;
  }
  if (!is_tensor(args[0]) || !is_tensor(args[1]) || (args[2] != Py_None && !is_tensor(args[2]))) {
    Py_RETURN_FALSE;
  }
  if (check_token(g_plain) < 0) {
    return nullptr;
  }
  const at::Tensor& a = THPVariable_Unpack(args[0]);
  const at::Tensor& w = THPVariable_Unpack(args[1]);
  const at::Tensor* b = args[2] == Py_None ? nullptr : &THPVariable_Unpack(args[2]);
  auto key = make_key(a, w, b);
  if (!key) {
    Py_RETURN_FALSE;
  }
  PyObject* probe = args[3] == Py_None ? nullptr : args[3];
  Py_XINCREF(probe);
  store(g_plain, *key, Plain{probe});
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// ------------------------------------------------------------------------------------------ gemm_a8w8_blockscale

bool make_block_key(PyObject* const* ops, at::ScalarType out, BlockKey& key) {
  for (int i = 0; i < 4; ++i) {
    const at::Tensor& t = THPVariable_Unpack(ops[i]);
    if (t.dim() != 2) {
      return false;
    }
    key.sizes[2 * i] = t.size(0);
    key.sizes[2 * i + 1] = t.size(1);
    key.dtypes[i] = static_cast<int16_t>(t.scalar_type());
    key.devices[i] = device_code(t);
  }
  key.dtypes[4] = static_cast<int16_t>(out);
  return true;
}

// gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype=torch.bfloat16, config=None)
PyObject* gemm_a8w8_blockscale(PyObject* /*self*/, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  if (g_block.fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "aiter_gemm eager_fast: setup_blockscale() was not called");
    return nullptr;
  }
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* dtype = nargs > 4 ? args[4] : nullptr;
  PyObject* config = nargs > 5 ? args[5] : Py_None;
  bool simple = nargs >= 4 && nargs <= 6;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; simple && i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (name == g_dtype_name && dtype == nullptr) {
      dtype = args[nargs + i];
    } else if (name == g_config_name && nargs <= 5) {
      config = args[nargs + i];
    } else {
      simple = false;  // unusual spelling (a non-interned name, a duplicate): the Python entry sorts it out
    }
  }
  for (int i = 0; simple && i < 4; ++i) {
    simple = is_tensor(args[i]);
  }
  simple = simple && config == Py_None && (dtype == nullptr || THPDtype_Check(dtype));
  if (simple) {
    const int stale = check_token(g_block);
    if (stale < 0) {
      return nullptr;
    }
    BlockKey key;
    const at::ScalarType out = dtype == nullptr ? at::kBFloat16 : reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    if (stale == 0 && make_block_key(args, out, key)) {
      auto it = g_block.map.find(key);
      if (it != g_block.map.end()) {
        const int capturing = probe_says_capturing(it->second.probe);
        if (capturing < 0) {
          return nullptr;
        }
        if (!capturing) {
          PyObject* call[5] = {args[0], args[1], args[2], args[3],
                               dtype != nullptr ? dtype : reinterpret_cast<PyObject*>(torch::getTHPDtype(out))};
          PyObject* runner = it->second.runner;  // held across the call: a reload inside it may drop the map
          Py_INCREF(runner);
          PyObject* result = PyObject_Vectorcall(runner, call, 5, nullptr);
          Py_DECREF(runner);
          return result;
        }
      }
    }
  }
  return PyObject_Vectorcall(g_block.fallback, args, nargsf, kwnames);
  END_HANDLE_TH_ERRORS
}

// remember_blockscale(XQ, WQ, x_scale, w_scale, dtype, runner, probe): calls with these operands' shapes, dtypes
// and devices and this output dtype run ``runner`` (always, or while probe() is false). Called by the Python path
// after it validated the operands and decided the shape.
PyObject* remember_blockscale(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError,
                    "aiter_gemm eager_fast.remember_blockscale(XQ, WQ, x_scale, w_scale, dtype, runner, probe) takes "
                    "7 arguments");
    return nullptr;
  }
  for (int i = 0; i < 4; ++i) {
    if (!is_tensor(args[i])) {
      Py_RETURN_FALSE;
    }
  }
  if (!THPDtype_Check(args[4]) || !PyCallable_Check(args[5])) {
    Py_RETURN_FALSE;
  }
  if (check_token(g_block) < 0) {
    return nullptr;
  }
  BlockKey key;
  if (!make_block_key(args, reinterpret_cast<THPDtype*>(args[4])->scalar_type, key)) {
    Py_RETURN_FALSE;
  }
  Runner value{args[5], args[6] == Py_None ? nullptr : args[6]};
  Py_INCREF(value.runner);
  Py_XINCREF(value.probe);
  store(g_block, key, value);
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// setup_blockscale(cache, fallback): the blockscale op's DecisionCache (its ``generation`` validates the map) and
// its Python entry. setup() must have been called (it sets the capture counter).
PyObject* setup_blockscale(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.setup_blockscale(cache, fallback)");
    return nullptr;
  }
  drop(g_block);
  g_block.generation = -1;
  Py_INCREF(args[0]);
  Py_XSETREF(g_block.cache, args[0]);
  Py_INCREF(args[1]);
  Py_XSETREF(g_block.fallback, args[1]);
  Py_RETURN_NONE;
}

// setup(cache, fallback, capturing, capture_state): gemm_a16w16's DecisionCache (its ``generation`` validates the
// map), the Python gemm_a16w16 for every other call, and the public capture counter cudagraph.capturing reads.
PyObject* setup(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.setup(cache, fallback, capturing, capture_state)");
    return nullptr;
  }
  drop(g_plain);
  g_plain.generation = -1;
  PyObject** slots[] = {&g_plain.cache, &g_plain.fallback, &g_capturing, &g_local};
  for (int i = 0; i < 4; ++i) {
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  Py_RETURN_NONE;
}

// cached() -> int: how many plain decisions the C++ cache holds (tests).
PyObject* cached(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyLong_FromSize_t(g_plain.map.size() + g_block.map.size());
}

PyMethodDef kMethods[] = {
    {"gemm_a16w16", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(gemm_a16w16)),
     METH_FASTCALL | METH_KEYWORDS,
     "gemm_a16w16($module, A, B, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None)\n--\n\n"
     "F.linear(A, B, bias) through the tuned dispatch (C++ entry: cached plain decisions run at::linear here, every "
     "other call runs aiter_gemm.ops' Python gemm_a16w16)."},
    {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(linear)), METH_FASTCALL,
     "linear(module, input) -> Tensor | None: a TunedLinear call whose decision is cached plain F.linear, or None"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call)), METH_FASTCALL,
     "call(module, input) -> Tensor | None: linear() where nn.Module.__call__ would go straight to forward, or None"},
    {"setup_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(setup_call)), METH_FASTCALL,
     "setup_call(names, global_dicts): the hook stores Module.__call__ looks at (instance dict names, global dicts)"},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(remember)), METH_FASTCALL,
     "remember(A, B, bias, probe) -> bool: cache a plain decision (probe: None, or a capture probe)"},
    {"setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(setup)), METH_FASTCALL,
     "setup(cache, fallback, capturing, capture_state)"},
    {"gemm_a8w8_blockscale",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(gemm_a8w8_blockscale)),
     METH_FASTCALL | METH_KEYWORDS,
     "gemm_a8w8_blockscale($module, XQ, WQ, x_scale, w_scale, dtype=torch.bfloat16, config=None)\n--\n\n"
     "The block-scale op through the tuned dispatch (C++ entry: remembered decisions call their runner from here, "
     "every other call runs aiter_gemm.blockscale's Python gemm_a8w8_blockscale)."},
    {"remember_blockscale", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(remember_blockscale)),
     METH_FASTCALL, "remember_blockscale(XQ, WQ, x_scale, w_scale, dtype, runner, probe) -> bool"},
    {"setup_blockscale", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(setup_blockscale)),
     METH_FASTCALL, "setup_blockscale(cache, fallback)"},
    {"cached", cached, METH_NOARGS, "cached() -> int: decisions held (both ops)"},
    {nullptr, nullptr, 0, nullptr}};

#define AITER_STR_(x) #x
#define AITER_STR(x) AITER_STR_(x)
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, AITER_STR(TORCH_EXTENSION_NAME), nullptr, -1, kMethods};

}  // namespace

#define AITER_CONCAT_(a, b) a##b
#define AITER_CONCAT(a, b) AITER_CONCAT_(a, b)

PyMODINIT_FUNC AITER_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  g_generation_name = PyUnicode_InternFromString("generation");
  g_depth_name = PyUnicode_InternFromString("depth");
  g_params_name = PyUnicode_InternFromString("_parameters");
  g_weight_name = PyUnicode_InternFromString("weight");
  g_bias_name = PyUnicode_InternFromString("bias");
  g_shuffled_name = PyUnicode_InternFromString("is_shuffled");
  g_dtype_name = PyUnicode_InternFromString("dtype");
  g_config_name = PyUnicode_InternFromString("config");
  g_forward_name = PyUnicode_InternFromString("forward");
  g_compiled_name = PyUnicode_InternFromString("_compiled_call_impl");
  if (!g_generation_name || !g_depth_name || !g_params_name || !g_weight_name || !g_bias_name || !g_shuffled_name ||
      !g_dtype_name || !g_config_name || !g_forward_name || !g_compiled_name) {
    return nullptr;
  }
  return PyModule_Create(&kModule);
}
