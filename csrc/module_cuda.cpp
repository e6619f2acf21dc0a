// The Python module linrec._C_cuda, written against the limited API (abi3): the
// CUDA kernels. Its ops register themselves (ops_cuda.cpp, STABLE_TORCH_LIBRARY_IMPL)
// when it loads; the module itself reports the compiled configs and kernel
// attributes, for linrec.compiled_configs, linrec.tune and linrec.func_attrs.
#include <Python.h>

#include <string>

#include "dispatch.h"
#include "kernels/launch.h"

namespace {

template <typename List>
PyObject* config_list(const List& configs) {
  PyObject* list = PyList_New(0);
  if (!list) return nullptr;
  for (const linrec::TileConfig& c : configs) {
    PyObject* item = Py_BuildValue("(iiii)", c.elems_per_thread, c.threads_per_block,
                                   static_cast<int>(c.memcode), static_cast<int>(c.algocode));
    if (!item || PyList_Append(list, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return list;
}

// compiled_configs(kernel, complex=False): the configs of a kernel, "tile", "pipe"
// (these two share a list), "chained", "strided" or "packed", for real storage or,
// with `complex`, for complex64 / complex128 (dispatch.h, chained.cuh, tiled.cuh).
PyObject* compiled_configs(PyObject*, PyObject* args) {
  const char* kernel = nullptr;
  int complex = 0;
  if (!PyArg_ParseTuple(args, "s|p", &kernel, &complex)) return nullptr;
  const std::string name(kernel);
  if (name == "strided") return config_list(linrec::STRIDED_CONFIG_LIST);
  if (name == "packed") return config_list(linrec::PACKED_CONFIG_LIST);
  if (name == "chained")
    return complex ? config_list(linrec::CHAINED_STAGED_CONFIG_LIST) : config_list(linrec::CHAINED_CONFIG_LIST);
  if (name == "tile") return complex ? config_list(linrec::COMPLEX_TILE_CONFIG_LIST) : config_list(linrec::CONFIG_LIST);
  if (name == "pipe") return complex ? PyList_New(0) : config_list(linrec::CONFIG_LIST);
  PyErr_SetString(PyExc_ValueError, "kernel must be 'tile', 'pipe', 'chained', 'strided' or 'packed'");
  return nullptr;
}

// func_attrs(dtype, kind, backward, variant, elems_per_thread, threads_per_block, memcode, algocode);
// variant: 0 the general kernel, 1 / 2 the aligned-rows kernel scanning forward / in reverse.
PyObject* func_attrs(PyObject*, PyObject* args) {
  int dtype, kind, backward, variant, e, t, m, a;
  if (!PyArg_ParseTuple(args, "iipiiiii", &dtype, &kind, &backward, &variant, &e, &t, &m, &a)) return nullptr;
  if (variant < 0 || variant > 2) {
    PyErr_SetString(PyExc_ValueError, "linrec: func_attrs variant is 0 (general), 1 or 2 (aligned rows)");
    return nullptr;
  }
  try {
    const linrec::FuncAttrs r = linrec::cuda_func_attrs(
        static_cast<linrec::DType>(dtype), static_cast<linrec::KernelKind>(kind), backward != 0,
        static_cast<linrec::KernelVariant>(variant),
        linrec::TileConfig{e, t, static_cast<linrec::MemCode>(m), static_cast<linrec::AlgoCode>(a)});
    return Py_BuildValue("{sisisisi}", "num_regs", r.num_regs, "local_bytes", r.local_bytes, "shared_bytes",
                         r.shared_bytes, "max_threads", r.max_threads);
  } catch (const std::exception& ex) {
    PyErr_SetString(PyExc_RuntimeError, ex.what());
    return nullptr;
  }
}

PyMethodDef methods[] = {
    {"compiled_configs", compiled_configs, METH_VARARGS,
     "The compiled TileConfigs of a kernel, for real or complex storage, as (elems_per_thread, "
     "threads_per_block, memcode, algocode)."},
    {"func_attrs", func_attrs, METH_VARARGS, "cudaFuncGetAttributes of one compiled kernel."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C_cuda", "linrec CUDA kernels", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C_cuda(void) { return PyModule_Create(&module_def); }
