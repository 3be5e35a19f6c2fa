// The module call entry of the C++ eager extension (eager_fast.cpp registers the ops): ``module(input)`` for an
// nn.Linear-like module (weight and bias in its ``_parameters``) whose call nn.Module.__call__ would hand straight
// to forward runs the remembered decision of ``op(input, weight, bias)``, the op set up for it (setup_linear:
// gemm_a16w16, TunedLinear's forward). Module.__call__ spends two Python frames and eight hook checks before forward;
// aiter_gemm/call_entry.py sets this up and holds its Python form.
//
// fp8_call does the same for the FP8Linear twin of aiter_gemm/fp8_linear.py: the activation quantizer's bound launch
// (its plan table, triton_launch.cpp), the block-scale op's entry (its remembered decision, else its Python path)
// and the bias, with no Python frame of ours; a call it cannot take from C++ alone returns None (the twin's
// forward runs it).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include "eager_fast.h"

#include <vector>

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

// The FP8Linear twin's call (setup_fp8): the quantizer's plan table (M-major x_scale), the block-scale op's entry,
// the capture probe; interned attribute names.
PyObject* g_fp8_table = nullptr;
PyObject* g_fp8_gemm = nullptr;
PyObject* g_fp8_probe = nullptr;
PyObject* g_scale_name = nullptr;
PyObject* g_override_names[2] = {};  // _aiter_gemm, _aiter_m_major: a twin with either set runs its forward

bool plain_tensor(PyObject* obj) {
  return THPVariable_CheckExact(obj);
}

// ``module(input)`` of an FP8Linear twin whose instance dict is ``dict``, from C++: the checks of the twin's forward
// (fp8 weight, float32 scales, an exact input tensor of a float dtype on the weight's device, no gradient
// wanted, no override) and of fp8_block_linear's eager call (M-major scales outside capture; no TorchFunctionMode,
// which the Python path's torch calls would report to). nullptr, error set or not, as serve.
PyObject* fp8_linear_of(PyObject* dict, PyObject* input) {
  for (PyObject* name : g_override_names) {
    PyObject* v = PyDict_GetItemWithError(dict, name);
    if ((v != nullptr && v != Py_None) || PyErr_Occurred()) {
      return nullptr;
    }
  }
  PyObject* params = PyDict_GetItemWithError(dict, g_params_name);
  if (params == nullptr || !PyDict_Check(params)) {
    return nullptr;
  }
  PyObject* weight = PyDict_GetItemWithError(params, g_weight_name);
  PyObject* scale = weight != nullptr ? PyDict_GetItemWithError(params, g_scale_name) : nullptr;
  if (scale == nullptr || PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* bias = PyDict_GetItemWithError(params, g_bias_name);
  if (PyErr_Occurred() || !plain_tensor(input) || !plain_tensor(weight) || !plain_tensor(scale) ||
      (bias != nullptr && bias != Py_None && !plain_tensor(bias))) {
    return nullptr;
  }
  const at::Tensor& x = THPVariable_Unpack(input);
  const at::Tensor& w = THPVariable_Unpack(weight);
  const at::ScalarType dtype = x.scalar_type();
  const bool has_bias = bias != nullptr && bias != Py_None;
  if (w.scalar_type() != at::kFloat8_e4m3fn || THPVariable_Unpack(scale).scalar_type() != at::kFloat ||
      (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat) || x.device() != w.device() || x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1) ||
      (has_bias && THPVariable_Unpack(bias).device() != w.device()) ||
      (c10::GradMode::is_enabled() && x.requires_grad()) || at::impl::torch_function_mode_enabled()) {
    return nullptr;
  }
  const bool table = PyCapsule_CheckExact(g_fp8_table);
  if (table && !x.is_cuda()) {
    return nullptr;  // bound launches are CUDA ones
  }
  const int capturing = probe_says_capturing(g_fp8_probe);
  if (capturing != 0) {
    return nullptr;  // capturing: the layout follows the decision there (the Python path); -1: error set
  }
  PyObject* x2 = THPVariable_Wrap(x.reshape({-1, x.size(-1)}));
  if (x2 == nullptr) {
    return nullptr;
  }
  // (XQ, x_scale), or nullptr / None: not bound for this input. A callable in place of the table: the CPU tests'
  // quantizer.
  PyObject* quantized = table ? run_table(g_fp8_table, &x2, 1) : PyObject_CallOneArg(g_fp8_table, x2);
  Py_DECREF(x2);
  if (quantized == nullptr || quantized == Py_None) {
    Py_XDECREF(quantized);
    return nullptr;
  }
  if (!PyTuple_Check(quantized) || PyTuple_GET_SIZE(quantized) != 2) {
    Py_DECREF(quantized);
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.fp8_call: the quantizer returned no (XQ, x_scale)");
    return nullptr;
  }
  PyObject* gemm_args[5] = {PyTuple_GET_ITEM(quantized, 0), weight, PyTuple_GET_ITEM(quantized, 1), scale,
                            reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))};
  PyObject* out = PyObject_Vectorcall(g_fp8_gemm, gemm_args, 5, nullptr);
  Py_DECREF(quantized);
  if (out == nullptr) {
    return nullptr;
  }
  if (!THPVariable_Check(out)) {
    Py_DECREF(out);
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.fp8_call: the block-scale op returned no tensor");
    return nullptr;
  }
  at::Tensor result = THPVariable_Unpack(out);
  Py_DECREF(out);
  if (has_bias) {
    result.add_(THPVariable_Unpack(bias));
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(w.size(0));
  return THPVariable_Wrap(result.view(shape));
}

// fp8_call(module, input) -> Tensor | None: ``module(input)`` for an FP8Linear twin whose call nn.Module.__call__
// would hand straight to forward and whose quantizer launch is bound for this input (fp8_linear_of); else None.
PyObject* fp8_call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.fp8_call(module, input) takes 2 arguments");
    return nullptr;
  }
  PyObject* dict = g_fp8_table != nullptr ? instance_dict(args[0]) : nullptr;
  if (dict == nullptr) {
    Py_RETURN_NONE;
  }
  const int bare = bare_module_call(dict);
  if (bare < 0) {
    return nullptr;
  }
  PyObject* out = bare ? fp8_linear_of(dict, args[1]) : nullptr;
  if (out != nullptr || PyErr_Occurred()) {
    return out;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// setup_fp8(table, gemm, probe): the quantizer's plan table (M-major scales; tests give a callable ``quant(x2) ->
// (XQ, x_scale) | None`` instead), the block-scale op's entry ``gemm(XQ, WQ, x_scale, w_scale, dtype)`` and the
// capture probe fp8_call uses. Until it is called fp8_call returns None.
PyObject* setup_fp8(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !(PyCapsule_IsValid(args[0], "aiter_gemm.triton_table") || PyCallable_Check(args[0])) ||
      !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "aiter_gemm eager_fast.setup_fp8(table, gemm, probe): a plan table (or a "
                    "quantizer) and two callables");
    return nullptr;
  }
  PyObject** slots[] = {&g_fp8_table, &g_fp8_gemm, &g_fp8_probe};
  for (int i = 0; i < 3; ++i) {
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  Py_RETURN_NONE;
}

#define AITER_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn))

PyMethodDef kMethods[] = {
    {"linear", AITER_FASTCALL(linear), METH_FASTCALL,
     "linear(module, input) -> Tensor | None: a TunedLinear call whose decision is remembered, or None"},
    {"call", AITER_FASTCALL(call), METH_FASTCALL,
     "call(module, input) -> Tensor | None: linear() where nn.Module.__call__ would go straight to forward, or None"},
    {"setup_linear", setup_linear, METH_O, "setup_linear(entry): the op linear() and call() run"},
    {"fp8_call", AITER_FASTCALL(fp8_call), METH_FASTCALL,
     "fp8_call(module, input) -> Tensor | None: an FP8Linear twin's call from C++ where it can run there, or None"},
    {"setup_fp8", AITER_FASTCALL(setup_fp8), METH_FASTCALL,
     "setup_fp8(table, gemm, probe): the quantizer's plan table, the block-scale op's entry, the capture probe"},
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
  g_scale_name = PyUnicode_InternFromString("weight_scale_inv");
  g_override_names[0] = PyUnicode_InternFromString("_aiter_gemm");
  g_override_names[1] = PyUnicode_InternFromString("_aiter_m_major");
  return g_params_name && g_weight_name && g_bias_name && g_forward_name && g_compiled_name && g_scale_name &&
         g_override_names[0] && g_override_names[1] &&
         PyModule_AddFunctions(module, kMethods) == 0;
}

}  // namespace aiter_eager
