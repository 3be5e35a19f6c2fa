// The module call entry of the C++ eager extension (eager_fast.cpp registers the ops): ``module(input)`` for an
// nn.Linear-like module (weight and bias in its ``_parameters``) whose call nn.Module.__call__ would hand straight
// to forward runs the remembered decision of ``op(input, weight, bias)``, the op set up for it (setup_linear:
// gemm_a16w16, TunedLinear's forward). Module.__call__ spends two Python frames and eight hook checks before forward;
// aiter_gemm/call_entry.py sets this up and holds its Python form.
#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include "eager_fast.h"

namespace aiter_eager {
namespace {

Op* g_linear_op = nullptr;  // the op linear() and call() run (setup_linear)
PyObject* g_params_name = nullptr;
PyObject* g_weight_name = nullptr;
PyObject* g_bias_name = nullptr;
PyObject* g_forward_name = nullptr;
PyObject* g_compiled_name = nullptr;
// The hook stores nn.Module.__call__ looks at, as aiter_gemm/call_entry.py found and checked them on this torch at
// set-up (their names in each module's dict, and torch's global dicts; strong, set by setup_call).
constexpr int kMaxHookDicts = 16;
int g_hook_count = 0;
PyObject* g_hook_names[kMaxHookDicts] = {};
PyObject* g_global_hooks[kMaxHookDicts] = {};

// The remembered decision of ``op(input, weight, bias)`` for the module whose instance dict is ``dict`` (an
// nn.Linear-like object: weight and bias in its ``_parameters``), or nullptr (error set or not: see serve).
PyObject* linear_of(PyObject* dict, PyObject* input) {
  if (g_linear_op == nullptr || dict == nullptr) {
    return nullptr;
  }
  PyObject* params = PyDict_GetItemWithError(dict, g_params_name);  // borrowed
  PyObject* weight = params != nullptr && PyDict_Check(params) ? PyDict_GetItemWithError(params, g_weight_name)
                                                              : nullptr;  // borrowed
  // bias absent from the parameter dict: not nn.Linear-like (the Python path reads the attribute)
  PyObject* bias = weight != nullptr ? PyDict_GetItemWithError(params, g_bias_name) : nullptr;
  if (bias == nullptr) {
    return nullptr;
  }
  PyObject* call_args[3] = {input, weight, bias};
  PyObject* bound[kMaxParams];
  const Py_ssize_t given = bind(*g_linear_op, call_args, 3, nullptr, bound);
  return given >= 0 ? serve(*g_linear_op, bound, given) : nullptr;
}

// linear(module, input) -> Tensor | None: a TunedLinear call whose decision is remembered, else None.
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
    PyObject* hooks = PyDict_GetItemWithError(dict, g_hook_names[i]);  // borrowed
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
// straight to forward (bare_module_call) and whose decision is remembered; else None (the caller runs
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

// setup_linear(entry): the op linear() and call() run for ``module(input)``: ``entry(input, weight, bias)``.
PyObject* setup_linear(PyObject* /*self*/, PyObject* entry) {
  Op* op = op_of(entry);
  if (op == nullptr) {
    return nullptr;
  }
  if (!takes_linear_args(*op)) {
    PyErr_Format(PyExc_TypeError, "aiter_gemm eager_fast.setup_linear: %R does not take (input, weight, bias)",
                 entry);
    return nullptr;
  }
  g_linear_op = op;
  Py_RETURN_NONE;
}

// setup_call(names, global_dicts): the hook stores nn.Module.__call__ looks at, as aiter_gemm/call_entry.py found
// them in this torch and checked them against those it knows (call_internals_error): their names in a module's
// instance dict, and torch's global dicts of the same kinds (filled in place when hooks are registered). Until it
// is called, call() always returns None.
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

#define AITER_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn))

PyMethodDef kMethods[] = {
    {"linear", AITER_FASTCALL(linear), METH_FASTCALL,
     "linear(module, input) -> Tensor | None: a TunedLinear call whose decision is remembered, or None"},
    {"call", AITER_FASTCALL(call), METH_FASTCALL,
     "call(module, input) -> Tensor | None: linear() where nn.Module.__call__ would go straight to forward, or None"},
    {"setup_linear", setup_linear, METH_O, "setup_linear(entry): the op linear() and call() run"},
    {"setup_call", AITER_FASTCALL(setup_call), METH_FASTCALL,
     "setup_call(names, global_dicts): the hook stores Module.__call__ looks at (instance dict names, global dicts)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool init_module_call(PyObject* module) {
  g_params_name = PyUnicode_InternFromString("_parameters");
  g_weight_name = PyUnicode_InternFromString("weight");
  g_bias_name = PyUnicode_InternFromString("bias");
  g_forward_name = PyUnicode_InternFromString("forward");
  g_compiled_name = PyUnicode_InternFromString("_compiled_call_impl");
  return g_params_name && g_weight_name && g_bias_name && g_forward_name && g_compiled_name &&
         PyModule_AddFunctions(module, kMethods) == 0;
}

}  // namespace aiter_eager
