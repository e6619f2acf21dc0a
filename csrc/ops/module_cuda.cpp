// The Python module linrec._C_cuda, written against the limited API (abi3): the
// CUDA kernels. Its ops register themselves (ops_cuda.cpp, STABLE_TORCH_LIBRARY_IMPL)
// when it loads; the module itself reports the compiled configs (the selective scan's too) and kernel
// attributes (linrec.compiled_configs, linrec.tune, linrec.func_attrs) and takes
// the tuning tables (linrec/tuning).
#include <Python.h>

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/launch.h"
#include "../registry.h"
#include "../tuning/kernel_choice.h"

namespace {

// A Python list of to_item(x) for the items of `items` (new references), or nullptr with the
// Python error set.
template <typename Items, typename ToItem>
PyObject* list_of(const Items& items, ToItem to_item) {
  PyObject* list = PyList_New(0);
  if (!list) return nullptr;
  for (const auto& x : items) {
    PyObject* item = to_item(x);
    if (!item || PyList_Append(list, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return list;
}

// The kernel kind and storage named by Python: a family id of the registry, two torch dtype
// names and whether the coefficients are log-coefficients. Sets a ValueError and returns false
// if either is unknown.
bool parse_kind_and_storage(int kind, const char* values, const char* coeffs, int log_coeffs,
                            linrec::KernelKind& out_kind, linrec::Storage& out_storage) {
  const std::optional<linrec::DType> v = linrec::dtype_named(values), c = linrec::dtype_named(coeffs);
  if (kind < 1 || kind > linrec::kMaxKernelKind || !v || !c) {
    PyErr_SetString(PyExc_ValueError, "linrec: unknown kernel id or dtype name");
    return false;
  }
  out_kind = static_cast<linrec::KernelKind>(kind);
  out_storage = {*v, *c, log_coeffs != 0};
  return true;
}

// compiled_configs(kind, values, coeffs, log_coeffs=False): the configs a family is compiled
// at for a storage, as (elems_per_thread, threads_per_block, memcode, algocode); [] where it is
// not compiled for that storage.
PyObject* compiled_configs(PyObject*, PyObject* args) {
  int kind_id, log_coeffs = 0;
  const char *values, *coeffs;
  if (!PyArg_ParseTuple(args, "iss|p", &kind_id, &values, &coeffs, &log_coeffs)) return nullptr;
  linrec::KernelKind kind;
  linrec::Storage storage;
  if (!parse_kind_and_storage(kind_id, values, coeffs, log_coeffs, kind, storage)) return nullptr;
  return list_of(linrec::cuda_compiled_configs(storage, kind), [](const linrec::TileConfig& c) {
    return Py_BuildValue("(iiii)", c.elems_per_thread, c.threads_per_block, static_cast<int>(c.memcode),
                         static_cast<int>(c.algocode));
  });
}

// func_attrs(kind, values, coeffs, backward, variant, elems_per_thread, threads_per_block, memcode,
// algocode, log_coeffs=False): a dict, or None where the family has no such variant (0 the
// general kernel, 1 / 2 the aligned-rows kernel scanning forward / in reverse).
PyObject* func_attrs(PyObject*, PyObject* args) {
  int kind_id, backward, variant, e, t, m, a, log_coeffs = 0;
  const char *values, *coeffs;
  if (!PyArg_ParseTuple(args, "isspiiiii|p", &kind_id, &values, &coeffs, &backward, &variant, &e, &t, &m, &a,
                        &log_coeffs))
    return nullptr;
  linrec::KernelKind kind;
  linrec::Storage storage;
  if (!parse_kind_and_storage(kind_id, values, coeffs, log_coeffs, kind, storage)) return nullptr;
  if (variant < 0 || variant > 2) {
    PyErr_SetString(PyExc_ValueError, "linrec: func_attrs variant is 0 (general), 1 or 2 (aligned rows)");
    return nullptr;
  }
  try {
    const std::optional<linrec::FuncAttrs> r = linrec::cuda_func_attrs(
        storage, kind, backward != 0, static_cast<linrec::KernelVariant>(variant),
        linrec::TileConfig{e, t, static_cast<linrec::MemCode>(m), static_cast<linrec::AlgoCode>(a)});
    if (!r) Py_RETURN_NONE;
    return Py_BuildValue("{sisisisi}", "num_regs", r->num_regs, "local_bytes", r->local_bytes, "shared_bytes",
                         r->shared_bytes, "max_threads", r->max_threads);
  } catch (const std::exception& ex) {
    PyErr_SetString(PyExc_RuntimeError, ex.what());
    return nullptr;
  }
}

// set_tuning_table(device, rows): device -1 for the default table; each row a tuple
// (storages, direction, interleaved, min_len, max_len, max_seqs_per_sm, min_tiles, kind,
// elems_per_thread, threads_per_block, memcode, algocode), as linrec/tuning builds them.
PyObject* set_tuning_table(PyObject*, PyObject* args) {
  int device;
  PyObject* rows;
  if (!PyArg_ParseTuple(args, "iO", &device, &rows)) return nullptr;
  // The limited API has no PySequence_Fast: items one by one, each a new reference.
  const Py_ssize_t n = PySequence_Size(rows);
  if (n < 0) return nullptr;
  std::vector<linrec::TuningRow> table;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* row = PySequence_GetItem(rows, i);
    if (!row) return nullptr;
    unsigned int storages;
    int direction, interleaved, kind, e, t, m, a;
    long long min_len, max_len, max_seqs_per_sm, min_tiles;
    const int ok = PyArg_ParseTuple(row, "IipLLLLiiiii", &storages, &direction, &interleaved, &min_len, &max_len,
                                    &max_seqs_per_sm, &min_tiles, &kind, &e, &t, &m, &a);
    Py_DECREF(row);
    if (!ok) return nullptr;
    table.push_back({storages, static_cast<linrec::Direction>(direction), interleaved != 0, min_len, max_len,
                     max_seqs_per_sm, min_tiles, static_cast<linrec::KernelKind>(kind),
                     linrec::TileConfig{e, t, static_cast<linrec::MemCode>(m), static_cast<linrec::AlgoCode>(a)}});
  }
  try {
    linrec::set_tuning_table(device, std::move(table));
  } catch (const std::exception& ex) {
    PyErr_SetString(PyExc_ValueError, ex.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// kernel_choice(values, coeffs, seq_len, num_seqs, interleaved, backward, device, sm_count): the
// tuned choice, (kind, elems_per_thread, threads_per_block, memcode, algocode), of a call of that
// shape on that device (its table, or the default one) with that many SMs.
PyObject* kernel_choice(PyObject*, PyObject* args) {
  const char *values, *coeffs;
  long long seq_len, num_seqs;
  int interleaved, backward, device, sm_count;
  if (!PyArg_ParseTuple(args, "ssLLppii", &values, &coeffs, &seq_len, &num_seqs, &interleaved, &backward, &device,
                        &sm_count))
    return nullptr;
  linrec::KernelKind unused;
  linrec::Storage storage;
  if (!parse_kind_and_storage(1, values, coeffs, 0, unused, storage)) return nullptr;
  try {
    const linrec::KernelChoice c =
        linrec::choose_kernel(storage, seq_len, num_seqs, interleaved != 0, backward != 0, device, sm_count);
    return Py_BuildValue("(iiiii)", static_cast<int>(c.kind), c.config.elems_per_thread, c.config.threads_per_block,
                         static_cast<int>(c.config.memcode), static_cast<int>(c.config.algocode));
  } catch (const std::exception& ex) {
    PyErr_SetString(PyExc_RuntimeError, ex.what());
    return nullptr;
  }
}

// selective_configs(): the selective scan's compiled configs, as (steps_per_thread, warps)
// (the automatic choice among them: cuda_selective_default).
PyObject* selective_configs(PyObject*, PyObject*) {
  return list_of(linrec::cuda_selective_configs(),
                 [](const linrec::SelectiveConfig& c) { return Py_BuildValue("(ii)", c.steps_per_thread, c.warps); });
}

PyMethodDef methods[] = {
    {"compiled_configs", compiled_configs, METH_VARARGS,
     "The compiled TileConfigs of a kernel family for a storage, as (elems_per_thread, threads_per_block, "
     "memcode, algocode)."},
    {"selective_configs", selective_configs, METH_NOARGS,
     "The selective scan's compiled configs, as (steps_per_thread, warps)."},
    {"func_attrs", func_attrs, METH_VARARGS, "cudaFuncGetAttributes of one compiled kernel, or None."},
    {"set_tuning_table", set_tuning_table, METH_VARARGS, "Set the tuning table of a device (-1: the default)."},
    {"kernel_choice", kernel_choice, METH_VARARGS, "The tuned kernel and config for a call's shape."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C_cuda", "linrec CUDA kernels", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C_cuda(void) { return PyModule_Create(&module_def); }
