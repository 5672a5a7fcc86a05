"""Builds a tiny C++ extension whose function throws c10::Error in a std::thread.

The exception escapes the thread, so the process dies the way a CUDA/HIP error in a
worker thread kills it: `terminate called after throwing an instance of 'c10::Error'`.
Usage: python crash_ext.py BUILD_DIR [crash]  (prints the path of the built module)
"""

import sys

from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <thread>
void crash_in_thread() {
  std::thread worker([] {
    TORCH_CHECK(false, "CUDA error: an illegal memory access was encountered (raised on CPU by triage's fixture)");
  });
  worker.join();
}
"""

module = load_inline(
    name="triage_crash",
    cpp_sources=[SOURCE],
    functions=["crash_in_thread"],
    build_directory=sys.argv[1],
    verbose=False,
)
print(module.__file__)
if sys.argv[2:] == ["crash"]:
    module.crash_in_thread()
