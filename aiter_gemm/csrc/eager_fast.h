// What the module call entry (module_call.cpp) uses of the op entries (eager_fast.cpp): one extension, two files.
#pragma once

#include <Python.h>

#include <cstdint>

namespace aiter_eager {

constexpr int kMaxParams = 32;  // an op's parameters (AITER's fused_moe has 22); the None mask holds 64

struct Op;  // a registered op (eager_fast.cpp)

// The op behind an entry function register_op made, or nullptr with a TypeError set.
Op* op_of(PyObject* fn);

// Whether the op's leading parameters are (tensor, tensor, tensor or None): what ``op(input, weight, bias)`` binds.
bool takes_linear_args(const Op& op);

// The call's arguments in parameter order in ``out`` (borrowed; defaults filled), and how many leading ones the
// call gave (all of them for a call with keywords). -1 when the entry does not bind the call: too many arguments,
// an unknown or repeated keyword (names match by identity: call sites intern them), a required argument missing, a
// bypass argument other than its default. The Python entry then takes it.
Py_ssize_t bind(const Op& op, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out);

// What the op's remembered decision returns for a bound call (``given``: bind's answer). nullptr with no error set:
// not served here (the caller runs the Python entry); nullptr with an error set: a Python error.
PyObject* serve(Op& op, PyObject* const* bound, Py_ssize_t given);

// The instance dict of ``obj`` (borrowed), or nullptr.
PyObject* instance_dict(PyObject* obj);

// A bound Triton launch (triton_launch.cpp) of ``plan`` (a plan object) with these inputs: a new reference to the
// tuple of its outputs; nullptr with no error set: not taken (the caller runs Triton's launch); with one: an error.
PyObject* run_plan(PyObject* plan, PyObject* const* args, Py_ssize_t nargs);

// The plan of ``table`` (a plan table) for a call whose first input is args[0], launched: run_plan's answer; nullptr
// with no error set also where the table holds no plan for that input's dtype, device, sizes and strides.
PyObject* run_table(PyObject* table, PyObject* const* args, Py_ssize_t nargs);

// Whether this thread is capturing a CUDA graph, per ``probe`` (aiter_gemm.cudagraph's probe; read as the public
// capture counter where it is that one). 1/0; -1: error.
int probe_says_capturing(PyObject* probe);

// A TMA tensor map parameter of a bound Triton launch (tensor_map.cpp): cuTensorMapEncodeTiled's arguments but the
// global address, which is input ``tensor``'s data pointer per call; ``keep`` is ANDed into the encoded map.
struct TensorMapSpec {
  uint32_t param = 0, tensor = 0;  // the kernel parameter (a 128-byte by-value map) and the input it addresses
  int dtype = 0, interleave = 0, swizzle = 0, l2_promotion = 0, oob_fill = 0;
  uint32_t rank = 0;
  uint64_t dims[5] = {}, strides[4] = {};
  uint32_t box[5] = {}, element_strides[5] = {};
  uint64_t keep[16] = {};
  // The maps of the last kCachedMaps addresses (a weight's, a few activation buffers the allocator hands out in
  // turn), replaced in turn; a plan runs under the GIL, so no other thread writes them meanwhile.
  static constexpr int kCachedMaps = 4;
  mutable int cached_count = 0, cached_next = 0;
  mutable uint64_t cached_address[kCachedMaps] = {};
  mutable unsigned char cached[kCachedMaps][128] = {};
};

// A spec from its Python tuple (triton_launch.py: PlanArgs.tensor_maps); false with an error set.
bool parse_tensor_map(PyObject* obj, TensorMapSpec& out);

// The spec's map of ``address`` in ``out`` (128 bytes); false (no error set) where the driver cannot encode it.
bool encode_tensor_map(const TensorMapSpec& spec, uint64_t address, unsigned char* out);

// Adds tensormap_encode and tensormap_bytes to the extension module.
bool init_tensor_map(PyObject* module);

// Adds the bound Triton launch functions (triton_plan, triton_run, triton_plan_params, triton_table*) to the
// extension module.
bool init_triton_launch(PyObject* module);

// Adds the module call entry's functions (call, linear, setup_call, setup_linear) to the extension module.
bool init_module_call(PyObject* module);

}  // namespace aiter_eager
