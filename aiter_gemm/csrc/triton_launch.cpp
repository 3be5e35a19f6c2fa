// Bound Triton launches: a compiled Triton kernel launched with cuLaunchKernel, without Triton's Python launcher
// (aiter_gemm/triton_launch.py builds the plans and documents them; docs/eager_path.md).
//
// Why: Triton's Python launcher (argument binding, specialization key, cache lookup, launch metadata, its C
// launcher's per-pointer driver queries) cost an activation quantizer call 30-54 us of host time on the H200 host,
// several times the kernel. A plan is one launch of one CompiledKernel with the arguments of the call that bound it
// (grid, integers, block and shared memory fixed): a call gives new tensors of the same dtype, device, sizes and
// strides (checked; pointers aligned where the bound ones were, as Triton specialized the kernel on it), the plan
// allocates the outputs, writes the pointers into the packed parameters and launches on torch's current stream. A
// call it cannot take returns None and the caller runs Triton's own launch. So does every call while a Triton
// launch hook is installed (a profiler's, e.g. proton's): Triton's launcher calls the hooks, a plan would skip them.
// An empty hook is none: Triton 3.5+ keeps its hooks in HookChain objects that are never None (empty ``calls``),
// older ones None; the hooks' owner (``triton.knobs.runtime``, or CompiledKernel before knobs) is read per call.
//
// A kernel taking host-side tensor descriptors gets each as a 128-byte TMA tensor map by value, encoded per call
// from the input's address (tensor_map.cpp).
//
// No CUDA header or library is needed at build time: the driver functions used are declared here and found at run
// time in the libcuda.so.1 the process has loaded (torch and Triton load it), so the extension builds and its
// packing is tested on machines without CUDA (triton_plan_params: the checks and the packed parameters, tensor maps
// left zero, no launch).
#include <Python.h>
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "eager_fast.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace aiter_eager {
namespace {

constexpr int kMaxKernelParams = 64;
constexpr size_t kMaxParamBytes = 1024;
constexpr int kMaxTensors = 16;

// The CUDA driver API as declared in cuda.h (CUDA 11 and later; opaque handles as void*).
using CUresult = int;
using LaunchKernelFn = CUresult (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, void* stream, void** params, void** extra);
using CtxGetCurrentFn = CUresult (*)(void** ctx);
using GetErrorStringFn = CUresult (*)(CUresult err, const char** str);

struct Driver {
  bool tried = false;
  LaunchKernelFn launch = nullptr;
  CtxGetCurrentFn ctx_get_current = nullptr;
  GetErrorStringFn error_string = nullptr;
};
Driver g_driver;

// The driver functions, from the libcuda.so.1 already loaded (it is, once torch or Triton touched the GPU); false
// when absent: no plan launches and callers run Triton's launch.
bool driver_ready() {
  if (!g_driver.tried) {
    g_driver.tried = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) {
      g_driver.launch = reinterpret_cast<LaunchKernelFn>(dlsym(lib, "cuLaunchKernel"));
      g_driver.ctx_get_current = reinterpret_cast<CtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
      g_driver.error_string = reinterpret_cast<GetErrorStringFn>(dlsym(lib, "cuGetErrorString"));
    }
  }
  return g_driver.launch != nullptr && g_driver.ctx_get_current != nullptr;
}

// What a bound tensor must look like in a later call (inputs) or how an output is made (outputs).
struct TensorSpec {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  bool align16 = false;  // inputs: the data pointer must be 16-byte aligned (the kernel was specialized on it)
};

struct Plan {
  uintptr_t function = 0;  // CUfunction of the loaded CompiledKernel (kept alive by ``keepalive``)
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 32;
  unsigned shared = 0;
  c10::Device device{c10::DeviceType::CPU};
  std::vector<unsigned char> blob;       // the packed parameters (pointers zero until a call fills them)
  std::vector<uint32_t> offsets;         // each kernel parameter's offset in blob
  std::vector<std::pair<uint32_t, uint32_t>> pointers;  // (offset in blob, tensor index: inputs, then outputs)
  std::vector<TensorSpec> inputs, outputs;
  std::vector<TensorMapSpec> maps;  // by-value TMA tensor maps, encoded per call from their input's address
  PyObject* keepalive = nullptr;  // strong: what owns the CUmodule (Triton's CompiledKernel)
  PyObject* hooks = nullptr;      // strong: what holds Triton's launch_enter_hook / launch_exit_hook
};

void plan_destructor(PyObject* capsule) {
  auto* plan = static_cast<Plan*>(PyCapsule_GetPointer(capsule, "aiter_gemm.triton_plan"));
  if (plan != nullptr) {
    Py_XDECREF(plan->keepalive);
    Py_XDECREF(plan->hooks);
    delete plan;
  }
}

bool int_list(PyObject* seq, std::vector<int64_t>& out, const char* what) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == nullptr) {
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

// (dtype, sizes, strides, align16) tuples.
bool parse_specs(PyObject* seq, std::vector<TensorSpec>& out) {
  PyObject* fast = PySequence_Fast(seq, "triton_plan: tensor specs must be a sequence");
  if (fast == nullptr) {
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  bool ok = n <= kMaxTensors;
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "triton_plan: at most %d tensors", kMaxTensors);
  }
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    PyObject *dtype, *sizes, *strides;
    int align16 = 0;
    TensorSpec spec;
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OOOp", &dtype, &sizes, &strides, &align16) &&
         int_list(sizes, spec.sizes, "sizes") && int_list(strides, spec.strides, "strides");
    if (ok && (!THPDtype_Check(dtype) || spec.sizes.size() != spec.strides.size())) {
      PyErr_SetString(PyExc_TypeError, "triton_plan: a tensor spec is (torch.dtype, sizes, strides, align16)");
      ok = false;
    }
    if (ok) {
      spec.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
      spec.align16 = align16 != 0;
      out.push_back(std::move(spec));
    }
  }
  Py_DECREF(fast);
  return ok;
}

// triton_plan(function, grid, block, shared, device, blob, offsets, pointers, inputs, outputs, tensor_maps,
// keepalive, hooks) -> plan. ``pointers``: (parameter index, tensor index) pairs; ``inputs``/``outputs``: (dtype,
// sizes, strides, align16); ``tensor_maps``: tensor map specs (parse_tensor_map) of 128-byte parameters at 64-byte
// aligned offsets, each addressing an input; ``hooks``: the object whose launch_enter_hook / launch_exit_hook
// attributes Triton's launcher calls.
PyObject* triton_plan(PyObject* /*self*/, PyObject* args) {
  HANDLE_TH_ERRORS
  unsigned long long function;
  unsigned gx, gy, gz, block, shared;
  PyObject *device, *offsets, *pointers, *inputs, *outputs, *maps, *keepalive, *hooks;
  Py_buffer blob;
  if (!PyArg_ParseTuple(args, "K(III)IIOy*OOOOOOO", &function, &gx, &gy, &gz, &block, &shared, &device, &blob,
                        &offsets, &pointers, &inputs, &outputs, &maps, &keepalive, &hooks)) {
    return nullptr;
  }
  auto plan = std::make_unique<Plan>();
  plan->function = static_cast<uintptr_t>(function);
  plan->grid[0] = gx;
  plan->grid[1] = gy;
  plan->grid[2] = gz;
  plan->block = block;
  plan->shared = shared;
  plan->blob.assign(static_cast<unsigned char*>(blob.buf), static_cast<unsigned char*>(blob.buf) + blob.len);
  PyBuffer_Release(&blob);
  if (!THPDevice_Check(device)) {
    PyErr_SetString(PyExc_TypeError, "triton_plan: device must be a torch.device");
    return nullptr;
  }
  plan->device = reinterpret_cast<THPDevice*>(device)->device;
  std::vector<int64_t> offs, ptrs;
  if (!int_list(offsets, offs, "offsets") || !int_list(pointers, ptrs, "pointers") ||
      !parse_specs(inputs, plan->inputs) || !parse_specs(outputs, plan->outputs)) {
    return nullptr;
  }
  const size_t n_tensors = plan->inputs.size() + plan->outputs.size();
  bool ok = offs.size() <= kMaxKernelParams && plan->blob.size() <= kMaxParamBytes && ptrs.size() % 2 == 0;
  for (const int64_t off : offs) {
    ok = ok && off >= 0 && static_cast<size_t>(off) <= plan->blob.size();
    plan->offsets.push_back(static_cast<uint32_t>(off));
  }
  for (size_t i = 0; ok && i < ptrs.size(); i += 2) {
    const int64_t param = ptrs[i], tensor = ptrs[i + 1];
    ok = param >= 0 && static_cast<size_t>(param) < offs.size() && tensor >= 0 &&
         static_cast<size_t>(tensor) < n_tensors && offs[param] + 8 <= static_cast<int64_t>(plan->blob.size());
    if (ok) {
      plan->pointers.emplace_back(static_cast<uint32_t>(offs[param]), static_cast<uint32_t>(tensor));
    }
  }
  PyObject* maps_fast = ok ? PySequence_Fast(maps, "triton_plan: tensor_maps must be a sequence") : nullptr;
  if (ok && maps_fast == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(maps_fast); ++i) {
    TensorMapSpec spec;
    if (!parse_tensor_map(PySequence_Fast_GET_ITEM(maps_fast, i), spec)) {
      Py_DECREF(maps_fast);
      return nullptr;
    }
    ok = spec.param < offs.size() && offs[spec.param] % 64 == 0 &&
         offs[spec.param] + 128 <= static_cast<int64_t>(plan->blob.size()) && spec.tensor < plan->inputs.size();
    spec.param = ok ? static_cast<uint32_t>(offs[spec.param]) : 0;  // from here on: the offset in blob
    plan->maps.push_back(spec);
  }
  Py_XDECREF(maps_fast);
  if (!ok) {
    PyErr_Format(PyExc_ValueError, "triton_plan: at most %d parameters of %d bytes; pointer slots must name a "
                 "parameter of 8 bytes and a tensor, tensor maps a 64-byte aligned parameter of 128 bytes and an "
                 "input", kMaxKernelParams, static_cast<int>(kMaxParamBytes));
    return nullptr;
  }
  Py_INCREF(keepalive);
  plan->keepalive = keepalive;
  Py_INCREF(hooks);
  plan->hooks = hooks;
  PyObject* capsule = PyCapsule_New(plan.get(), "aiter_gemm.triton_plan", plan_destructor);
  if (capsule == nullptr) {
    Py_DECREF(keepalive);
    Py_DECREF(hooks);
    return nullptr;
  }
  plan.release();
  return capsule;
  END_HANDLE_TH_ERRORS
}

Plan* plan_of(PyObject* obj) {
  return static_cast<Plan*>(PyCapsule_GetPointer(obj, "aiter_gemm.triton_plan"));
}

// Whether ``obj`` is a plain tensor matching ``spec`` on the plan's device.
bool matches(const Plan& plan, PyObject* obj, const TensorSpec& spec) {
  if (!THPVariable_CheckExact(obj)) {
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  return t.scalar_type() == spec.dtype && t.device() == plan.device && t.sizes().equals(spec.sizes) &&
         t.strides().equals(spec.strides) &&
         (!spec.align16 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
}

// Whether Triton's launch hook ``name`` of ``owner`` is none: None, or an empty HookChain (a ``calls`` list with no
// entry). Anything else (a callable, a chain with hooks, an attribute error) is a hook that does something.
bool hook_is_empty(PyObject* owner, PyObject* name) {
  static PyObject* calls_name = PyUnicode_InternFromString("calls");
  PyObject* hook = PyObject_GetAttr(owner, name);
  if (hook == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool empty = hook == Py_None;
  if (!empty) {
    PyObject* calls = PyObject_GetAttr(hook, calls_name);
    if (calls == nullptr) {
      PyErr_Clear();
    } else {
      empty = PyList_CheckExact(calls) && PyList_GET_SIZE(calls) == 0;
      Py_DECREF(calls);
    }
  }
  Py_DECREF(hook);
  return empty;
}

bool no_launch_hooks(const Plan& plan) {
  static PyObject* enter = PyUnicode_InternFromString("launch_enter_hook");
  static PyObject* exit_ = PyUnicode_InternFromString("launch_exit_hook");
  return hook_is_empty(plan.hooks, enter) && hook_is_empty(plan.hooks, exit_);
}

// The outputs allocated and every pointer written into ``buf`` (a copy of the plan's blob), and with ``encode`` the
// tensor maps (else left zero). False: the bound launch does not take this call (the inputs do not match the bound
// ones, a Triton launch hook is installed, or the driver cannot encode a tensor map).
bool pack(const Plan& plan, PyObject* const* args, Py_ssize_t nargs, unsigned char* buf,
          std::vector<at::Tensor>& outs, bool encode) {
  if (nargs != static_cast<Py_ssize_t>(plan.inputs.size()) || !no_launch_hooks(plan)) {
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (!matches(plan, args[i], plan.inputs[i])) {
      return false;
    }
  }
  outs.reserve(plan.outputs.size());
  for (const TensorSpec& spec : plan.outputs) {
    outs.push_back(at::empty_strided(spec.sizes, spec.strides, at::TensorOptions(spec.dtype).device(plan.device)));
  }
  std::memcpy(buf, plan.blob.data(), plan.blob.size());
  for (const auto& [offset, index] : plan.pointers) {
    const at::Tensor& t = index < plan.inputs.size() ? THPVariable_Unpack(args[index])
                                                    : outs[index - plan.inputs.size()];
    const uint64_t ptr = reinterpret_cast<uintptr_t>(t.data_ptr());
    std::memcpy(buf + offset, &ptr, sizeof(ptr));
  }
  for (const TensorMapSpec& spec : plan.maps) {
    const uint64_t ptr = reinterpret_cast<uintptr_t>(THPVariable_Unpack(args[spec.tensor]).data_ptr());
    if (encode && !encode_tensor_map(spec, ptr, buf + spec.param)) {
      return false;
    }
  }
  return true;
}

PyObject* wrap_outputs(std::vector<at::Tensor>& outs) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (tuple == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    PyObject* item = THPVariable_Wrap(std::move(outs[i]));
    if (item == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  return tuple;
}

}  // namespace

// (eager_fast.h)
PyObject* run_plan(PyObject* plan_obj, PyObject* const* args, Py_ssize_t nargs) {
  Plan* plan = plan_of(plan_obj);
  if (plan == nullptr) {
    return nullptr;
  }
  if (plan->device.type() != c10::DeviceType::CUDA || !driver_ready()) {
    return nullptr;
  }
  const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* ctx = nullptr;
  // The kernel's module lives in the plan device's context: another current device (or none yet on this thread)
  // goes to Triton's launch, which sets it up.
  if (cuda->getDevice() != plan->device || g_driver.ctx_get_current(&ctx) != 0 || ctx == nullptr) {
    return nullptr;
  }
  alignas(64) unsigned char buf[kMaxParamBytes];
  std::vector<at::Tensor> outs;
  if (!pack(*plan, args, nargs, buf, outs, true)) {
    return nullptr;
  }
  std::array<void*, kMaxKernelParams> params{};
  for (size_t i = 0; i < plan->offsets.size(); ++i) {
    params[i] = buf + plan->offsets[i];
  }
  void* stream = cuda->getStream(plan->device).native_handle();
  const CUresult err = g_driver.launch(reinterpret_cast<void*>(plan->function), plan->grid[0], plan->grid[1],
                                       plan->grid[2], plan->block, 1, 1, plan->shared, stream, params.data(),
                                       nullptr);
  if (err != 0) {
    const char* msg = nullptr;
    if (g_driver.error_string == nullptr || g_driver.error_string(err, &msg) != 0) {
      msg = "unknown error";
    }
    PyErr_Format(PyExc_RuntimeError, "aiter_gemm: cuLaunchKernel of a bound Triton kernel failed: %s (CUresult %d)",
                 msg, err);
    return nullptr;
  }
  return wrap_outputs(outs);
}

namespace {

// A plan table: a kernel's plans by their first input's dtype, device, sizes and strides, so a caller finds the
// plan of a call from its tensor in C++ (no Python key per call). Each plan still checks the whole call.
constexpr int kMaxDims = 8;

struct InputKey {
  int len = 0;
  std::array<int64_t, 2 + 2 * kMaxDims> w{};
  bool operator==(const InputKey& o) const {
    return len == o.len && std::equal(w.begin(), w.begin() + len, o.w.begin());
  }
};

struct InputKeyHash {
  size_t operator()(const InputKey& key) const {
    uint64_t h = static_cast<uint64_t>(key.len);
    for (int i = 0; i < key.len; ++i) {
      h = (h ^ static_cast<uint64_t>(key.w[i])) * 0x100000001B3ULL;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

using Table = std::unordered_map<InputKey, PyObject*, InputKeyHash>;  // plans held strongly

int64_t device_word(const c10::Device& dev) {
  return (static_cast<int64_t>(dev.type()) << 8) | (dev.index() + 1);
}

bool make_input_key(at::ScalarType dtype, const c10::Device& dev, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    InputKey& key) {
  const size_t nd = sizes.size();
  if (nd > static_cast<size_t>(kMaxDims) || strides.size() != nd) {
    return false;
  }
  key.len = 0;
  key.w[key.len++] = static_cast<int64_t>(dtype);
  key.w[key.len++] = device_word(dev);
  for (size_t i = 0; i < nd; ++i) {
    key.w[key.len++] = sizes[i];
  }
  for (size_t i = 0; i < nd; ++i) {
    key.w[key.len++] = strides[i];
  }
  return true;
}

void table_clear(Table& table) {
  for (auto& item : table) {
    Py_DECREF(item.second);
  }
  table.clear();
}

void table_destructor(PyObject* capsule) {
  auto* table = static_cast<Table*>(PyCapsule_GetPointer(capsule, "aiter_gemm.triton_table"));
  if (table != nullptr) {
    table_clear(*table);
    delete table;
  }
}

Table* table_of(PyObject* obj) {
  return static_cast<Table*>(PyCapsule_GetPointer(obj, "aiter_gemm.triton_table"));
}

// The plan (borrowed) stored for a call whose first input is ``obj``, or nullptr (no error set unless ``table`` is
// not a table).
PyObject* table_find(PyObject* table_obj, PyObject* obj) {
  Table* table = table_of(table_obj);
  if (table == nullptr || !THPVariable_CheckExact(obj)) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  InputKey key;
  if (!make_input_key(t.scalar_type(), t.device(), t.sizes(), t.strides(), key)) {
    return nullptr;
  }
  auto it = table->find(key);
  return it == table->end() ? nullptr : it->second;
}

}  // namespace

// (eager_fast.h)
PyObject* run_table(PyObject* table, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* plan = nargs >= 1 ? table_find(table, args[0]) : nullptr;
  if (plan == nullptr) {
    return nullptr;
  }
  Py_INCREF(plan);  // held across the launch: nothing below runs Python that could clear the table, but be safe
  PyObject* out = run_plan(plan, args, nargs);
  Py_DECREF(plan);
  return out;
}

namespace {

// triton_table() -> an empty plan table.
PyObject* triton_table(PyObject* /*self*/, PyObject* /*unused*/) {
  auto table = std::make_unique<Table>();
  PyObject* capsule = PyCapsule_New(table.get(), "aiter_gemm.triton_table", table_destructor);
  if (capsule != nullptr) {
    table.release();
  }
  return capsule;
}

// triton_table_add(table, plan): the plan stored under its first input's dtype, device, sizes and strides
// (replacing the one there).
PyObject* triton_table_add(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Table* table = nargs == 2 ? table_of(args[0]) : nullptr;
  Plan* plan = table != nullptr ? plan_of(args[1]) : nullptr;
  if (plan == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "triton_table_add(table, plan)");
    }
    return nullptr;
  }
  InputKey key;
  if (plan->inputs.empty() || !make_input_key(plan->inputs[0].dtype, plan->device, plan->inputs[0].sizes,
                                              plan->inputs[0].strides, key)) {
    PyErr_Format(PyExc_ValueError, "triton_table_add: a plan with a first input of at most %d dims", kMaxDims);
    return nullptr;
  }
  Py_INCREF(args[1]);
  auto [it, added] = table->emplace(key, args[1]);
  if (!added) {
    Py_DECREF(it->second);
    it->second = args[1];
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// triton_table_find(table, input) -> plan | None: the plan a call with this first input would run (tests).
PyObject* triton_table_find(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || table_of(args[0]) == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "triton_table_find(table, input)");
    }
    return nullptr;
  }
  PyObject* plan = table_find(args[0], args[1]);
  if (plan == nullptr) {
    Py_RETURN_NONE;
  }
  Py_INCREF(plan);
  return plan;
  END_HANDLE_TH_ERRORS
}

// triton_table_clear(table) -> the number of plans dropped.
PyObject* triton_table_clear(PyObject* /*self*/, PyObject* table_obj) {
  Table* table = table_of(table_obj);
  if (table == nullptr) {
    return nullptr;
  }
  const size_t n = table->size();
  table_clear(*table);
  return PyLong_FromSize_t(n);
}

// triton_table_run(table, *inputs) -> tuple of outputs, or None: the plan of the first input's key, launched.
PyObject* triton_table_run(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "triton_table_run(table, *inputs)");
    return nullptr;
  }
  PyObject* out = run_table(args[0], args + 1, nargs - 1);
  if (out != nullptr || PyErr_Occurred()) {
    return out;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// triton_run(plan, *inputs) -> tuple of outputs, or None (not taken: the caller runs Triton's launch).
PyObject* triton_run(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "triton_run(plan, *inputs)");
    return nullptr;
  }
  PyObject* out = run_plan(args[0], args + 1, nargs - 1);
  if (out != nullptr || PyErr_Occurred()) {
    return out;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// triton_plan_params(plan, *inputs) -> (bytes, outputs) | None: what a launch would pass (the packed parameters,
// pointers written, tensor maps zero) and the outputs it allocated, without launching, on any device (tests); None where the bound
// launch does not take the call (as triton_run answers None).
PyObject* triton_plan_params(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Plan* plan = nargs >= 1 ? plan_of(args[0]) : nullptr;
  if (plan == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "triton_plan_params(plan, *inputs)");
    }
    return nullptr;
  }
  alignas(64) unsigned char buf[kMaxParamBytes];
  std::vector<at::Tensor> outs;
  if (!pack(*plan, args + 1, nargs - 1, buf, outs, false)) {
    Py_RETURN_NONE;
  }
  PyObject* blob = PyBytes_FromStringAndSize(reinterpret_cast<char*>(buf), static_cast<Py_ssize_t>(plan->blob.size()));
  PyObject* tensors = blob == nullptr ? nullptr : wrap_outputs(outs);
  if (tensors == nullptr) {
    Py_XDECREF(blob);
    return nullptr;
  }
  return Py_BuildValue("(NN)", blob, tensors);
  END_HANDLE_TH_ERRORS
}

#define AITER_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn))

PyMethodDef kMethods[] = {
    {"triton_plan", triton_plan, METH_VARARGS,
     "triton_plan(function, grid, block, shared, device, blob, offsets, pointers, inputs, outputs, tensor_maps, "
     "keepalive, hooks) -> plan"},
    {"triton_run", AITER_FASTCALL(triton_run), METH_FASTCALL,
     "triton_run(plan, *inputs) -> tuple of outputs | None: the bound launch, or None where it does not apply"},
    {"triton_plan_params", AITER_FASTCALL(triton_plan_params), METH_FASTCALL,
     "triton_plan_params(plan, *inputs) -> (bytes, outputs) | None: the packed parameters, no launch (tests)"},
    {"triton_table", triton_table, METH_NOARGS, "triton_table() -> an empty plan table"},
    {"triton_table_add", AITER_FASTCALL(triton_table_add), METH_FASTCALL,
     "triton_table_add(table, plan): store the plan under its first input's dtype, device, sizes and strides"},
    {"triton_table_find", AITER_FASTCALL(triton_table_find), METH_FASTCALL,
     "triton_table_find(table, input) -> plan | None: the plan a call with this first input runs"},
    {"triton_table_clear", triton_table_clear, METH_O, "triton_table_clear(table) -> number of plans dropped"},
    {"triton_table_run", AITER_FASTCALL(triton_table_run), METH_FASTCALL,
     "triton_table_run(table, *inputs) -> tuple of outputs | None: the plan of the first input's key, launched"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool init_triton_launch(PyObject* module) {
  return PyModule_AddFunctions(module, kMethods) == 0;
}

}  // namespace aiter_eager
