// The Python module memeff._C: importing it loads this shared library, whose static
// TORCH_LIBRARY blocks register torch.ops.memeff.*. It defines no Python functions itself
// (the API is torch.ops.memeff and the memeff.torch package), so it needs no pybind11.
#include <Python.h>

extern "C" {

PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",                                   // m_name
      "memeff's torch ops (torch.ops.memeff)",  // m_doc
      -1,                                     // m_size
      nullptr,                                // m_methods
      nullptr, nullptr, nullptr, nullptr,
  };
  return PyModule_Create(&module_def);
}
}
