// TMA tensor maps (CUtensorMap) of bound Triton launches (triton_launch.cpp; aiter_gemm/triton_launch.py builds the
// specs and documents them).
//
// Why: a Triton kernel that takes a host-side tensor descriptor (``TensorDescriptor``, the block-scale GEMM's TMA
// configs) gets a 128-byte CUtensorMap by value, which Triton's launcher encodes per call from the tensor's address
// with cuTensorMapEncodeTiled. A plan fixes everything of that call but the address (the tensor's dtype, sizes and
// strides are checked per call), so it keeps cuTensorMapEncodeTiled's other arguments and encodes the map of each
// new address in C++; the last few addresses' maps are kept (a weight's never changes). Triton may post-process the map
// (3.9 clears a bit for tensors under 128 KiB on drivers up to 13.1, after CUTLASS): the plan applies ``keep``, an
// AND-mask that bind derives by comparing this encoding with Triton's own map of the bound call (tensormap_bytes),
// and declines a plan whose map differs otherwise.
//
// No CUDA header is needed: cuTensorMapEncodeTiled is declared here (cuda.h's signature, enums as int) and found at
// run time in the libcuda.so.1 the process has loaded.
#include <Python.h>
#include <dlfcn.h>

#include "eager_fast.h"

#include <cstring>
#include <vector>

namespace aiter_eager {
namespace {

using EncodeTiledFn = int (*)(void* map, int dtype, uint32_t rank, void* address, const uint64_t* dims,
                              const uint64_t* strides, const uint32_t* box, const uint32_t* element_strides,
                              int interleave, int swizzle, int l2_promotion, int oob_fill);

EncodeTiledFn encoder() {
  static bool tried = false;
  static EncodeTiledFn fn = nullptr;
  if (!tried) {
    tried = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib != nullptr) {
      fn = reinterpret_cast<EncodeTiledFn>(dlsym(lib, "cuTensorMapEncodeTiled"));
    }
  }
  return fn;
}

template <typename T>
bool fixed_list(PyObject* seq, T* out, size_t n, size_t max_n, const char* what) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == nullptr) {
    return false;
  }
  bool ok = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast)) == n && n <= max_n;
  for (size_t i = 0; ok && i < n; ++i) {
    out[i] = static_cast<T>(PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, static_cast<Py_ssize_t>(i))));
    ok = !PyErr_Occurred();
  }
  Py_DECREF(fast);
  if (!ok && !PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "tensor map spec: %s must hold %d values", what, static_cast<int>(n));
  }
  return ok;
}

// The map of ``address`` encoded with the spec's arguments into ``out`` (128 bytes, 64-byte aligned), ``keep``
// applied; false when the driver function is missing or refuses.
bool encode_raw(const TensorMapSpec& spec, uint64_t address, unsigned char* out) {
  EncodeTiledFn fn = encoder();
  if (fn == nullptr) {
    return false;
  }
  if (fn(out, spec.dtype, spec.rank, reinterpret_cast<void*>(address), spec.dims, spec.strides, spec.box,
         spec.element_strides, spec.interleave, spec.swizzle, spec.l2_promotion, spec.oob_fill) != 0) {
    return false;
  }
  uint64_t words[16];
  std::memcpy(words, out, sizeof(words));
  for (int i = 0; i < 16; ++i) {
    words[i] &= spec.keep[i];
  }
  std::memcpy(out, words, sizeof(words));
  return true;
}

// tensormap_encode(spec, address) -> bytes | None: the map a plan with this spec passes for ``address`` (bind's
// check against Triton's map); None where the driver function is missing or refuses.
PyObject* tensormap_encode(PyObject* /*self*/, PyObject* args) {
  PyObject* spec_obj;
  unsigned long long address;
  if (!PyArg_ParseTuple(args, "OK", &spec_obj, &address)) {
    return nullptr;
  }
  TensorMapSpec spec;
  if (!parse_tensor_map(spec_obj, spec)) {
    return nullptr;
  }
  alignas(64) unsigned char map[128];
  if (!encode_raw(spec, address, map)) {
    Py_RETURN_NONE;
  }
  return PyBytes_FromStringAndSize(reinterpret_cast<char*>(map), sizeof(map));
}

// tensormap_bytes(obj) -> bytes: the 128 bytes of Triton's PyCUtensorMap (its launcher's argument), the last member
// of that object (``PyObject_HEAD`` then the aligned CUtensorMap, whose size is a multiple of its alignment).
PyObject* tensormap_bytes(PyObject* /*self*/, PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  const char* name = type->tp_name;
  const size_t len = std::strlen(name), want = std::strlen("PyCUtensorMap");
  if (len < want || std::strcmp(name + len - want, "PyCUtensorMap") != 0 ||
      type->tp_basicsize < static_cast<Py_ssize_t>(sizeof(PyObject) + 128) || type->tp_itemsize != 0) {
    PyErr_Format(PyExc_TypeError, "tensormap_bytes: expected Triton's PyCUtensorMap, got %s", name);
    return nullptr;
  }
  const char* base = reinterpret_cast<const char*>(obj);
  return PyBytes_FromStringAndSize(base + type->tp_basicsize - 128, 128);
}

PyMethodDef kMethods[] = {
    {"tensormap_encode", tensormap_encode, METH_VARARGS,
     "tensormap_encode(spec, address) -> bytes | None: the tensor map a bound launch passes for this address"},
    {"tensormap_bytes", tensormap_bytes, METH_O, "tensormap_bytes(obj) -> bytes: the map in Triton's PyCUtensorMap"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// (eager_fast.h) (param, tensor, dtype, dims, strides, box, element_strides, interleave, swizzle, l2_promotion,
// oob_fill, keep): cuTensorMapEncodeTiled's arguments in its order (innermost dimension first; strides in bytes, one
// fewer than dims), ``keep`` 128 bytes or None (all ones).
bool parse_tensor_map(PyObject* obj, TensorMapSpec& out) {
  PyObject *dims, *strides, *box, *element_strides, *keep;
  unsigned param, tensor;
  if (!PyArg_ParseTuple(obj, "IIiOOOOiiiiO;a tensor map spec is (param, tensor, dtype, dims, strides, box, "
                        "element_strides, interleave, swizzle, l2_promotion, oob_fill, keep)",
                        &param, &tensor, &out.dtype, &dims, &strides, &box, &element_strides, &out.interleave,
                        &out.swizzle, &out.l2_promotion, &out.oob_fill, &keep)) {
    return false;
  }
  out.param = param;
  out.tensor = tensor;
  const Py_ssize_t rank = PySequence_Size(dims);
  if (rank < 1 || rank > 5) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "tensor map spec: rank must be 1 to 5");
    }
    return false;
  }
  out.rank = static_cast<uint32_t>(rank);
  if (!fixed_list(dims, out.dims, out.rank, 5, "dims") || !fixed_list(strides, out.strides, out.rank - 1, 4, "strides")
      || !fixed_list(box, out.box, out.rank, 5, "box") ||
      !fixed_list(element_strides, out.element_strides, out.rank, 5, "element_strides")) {
    return false;
  }
  std::memset(out.keep, 0xFF, sizeof(out.keep));
  if (keep != Py_None) {
    if (!PyBytes_Check(keep) || PyBytes_GET_SIZE(keep) != 128) {
      PyErr_SetString(PyExc_ValueError, "tensor map spec: keep must be 128 bytes or None");
      return false;
    }
    std::memcpy(out.keep, PyBytes_AS_STRING(keep), 128);
  }
  return true;
}

// (eager_fast.h)
bool encode_tensor_map(const TensorMapSpec& spec, uint64_t address, unsigned char* out) {
  for (int i = 0; i < spec.cached_count; ++i) {
    if (spec.cached_address[i] == address) {
      std::memcpy(out, spec.cached[i], 128);
      return true;
    }
  }
  alignas(64) unsigned char map[128];
  if (!encode_raw(spec, address, map)) {
    return false;
  }
  const int slot = spec.cached_next;
  spec.cached_next = (slot + 1) % TensorMapSpec::kCachedMaps;
  spec.cached_count = spec.cached_count < TensorMapSpec::kCachedMaps ? spec.cached_count + 1 : spec.cached_count;
  std::memcpy(spec.cached[slot], map, 128);
  spec.cached_address[slot] = address;
  std::memcpy(out, map, 128);
  return true;
}

bool init_tensor_map(PyObject* module) {
  return PyModule_AddFunctions(module, kMethods) == 0;
}

}  // namespace aiter_eager
