// The Python module linrec._C, written against the limited API (abi3): the ops'
// schemas and CPU kernels, which register themselves through STABLE_TORCH_LIBRARY
// when it loads (ops.cpp). The module itself reports what CUDA part the build
// has (linrec._C_cuda, module_cuda.cpp), so that Python can tell, before loading
// that part, whether this torch can run it.
#include <Python.h>

#ifndef LINREC_CUDA_VERSION
#define LINREC_CUDA_VERSION ""  // no CUDA part
#endif
#ifndef LINREC_CUDA_ARCHS
#define LINREC_CUDA_ARCHS ""
#endif

namespace {

PyObject* build_info(PyObject*, PyObject*) {
  return Py_BuildValue("{ssss}", "cuda_version", LINREC_CUDA_VERSION, "cuda_archs", LINREC_CUDA_ARCHS);
}

PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS,
     "The build's CUDA part (linrec._C_cuda): the CUDA version it was compiled with and its archs, '' if none."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "linrec ops and CPU kernels", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module_def); }
