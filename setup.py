"""Build linrec's compiled extensions: linrec._C and, with CUDA, linrec._C_cuda.

linrec._C holds the ops' schemas and the CPU kernel and links only torch's CPU
libraries, so it loads next to any torch; linrec._C_cuda holds the CUDA kernels
and links torch's CUDA library and the CUDA runtime of the CUDA version it was
built with, so Python loads it only next to a torch of that CUDA major version
(python/linrec/__init__.py). csrc/ops/*_cuda.cpp, csrc/tuning/ and the .cu files go
to linrec._C_cuda; csrc/ops/'s other .cpp files and csrc/cpu/ to linrec._C. One binary per CUDA major
version: the ops are written against the LibTorch stable ABI (torch >= 2.10)
and the modules against Python's limited API (abi3, Python >= 3.10). Environment:

  TORCH_CUDA_ARCH_LIST  archs to compile, e.g. "9.0" (default: sm_80..sm_120 that nvcc knows)
  LINREC_CONFIGS        "default" (the small tuned list) or "full" (the tuning product)
  LINREC_CPU_ONLY       "1" builds without CUDA even where it is available
  MAX_JOBS              parallel compile jobs (ninja)
"""

import os
import re
import shutil
import subprocess
from glob import glob
from pathlib import Path

# torch derives CUDA_HOME from the nvcc on PATH, which may be a wrapper script.
if "CUDA_HOME" not in os.environ and Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = Path(__file__).parent
TORCH_TARGET_VERSION = "0x020a000000000000"  # the stable ABI of torch 2.10
PY_LIMITED_API = "0x030A0000"  # Python 3.10


def nvcc_version():
    out = subprocess.run([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"], capture_output=True, text=True)
    major, minor = re.search(r"release (\d+)\.(\d+)", out.stdout).groups()
    return int(major), int(minor)


def nvcc_archs():
    """The sm_XY targets the nvcc in use can compile for, as ints (90 for sm_90)."""
    out = subprocess.run(
        [os.path.join(CUDA_HOME, "bin", "nvcc"), "--list-gpu-arch"], capture_output=True, text=True
    ).stdout
    return {int(m) for m in re.findall(r"compute_(\d+)\b", out)}


def default_arch_list():
    """sm_80, 86, 89, 90, plus 100 and 120 where nvcc supports them; PTX for the newest."""
    supported = nvcc_archs()
    archs = [a for a in (80, 86, 89, 90, 100, 120) if a in supported]
    names = [f"{a // 10}.{a % 10}" for a in archs]
    names[-1] += "+PTX"
    return ";".join(names)


def want_cuda():
    if os.environ.get("LINREC_CPU_ONLY", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None and shutil.which(
        os.path.join(CUDA_HOME, "bin", "nvcc")
    ) is not None


def version():
    """The single source is python/linrec/_version.py; wheels for a non-default CUDA
    version add a local tag from LINREC_LOCAL_VERSION (e.g. 0.1.0+cu126)."""
    text = (ROOT / "python" / "linrec" / "_version.py").read_text()
    base = re.search(r'__version__ = "([^"]+)"', text).group(1)
    local = os.environ.get("LINREC_LOCAL_VERSION")
    return f"{base}+{local}" if local else base


def extensions():
    ops = sorted(glob("csrc/ops/*.cpp"))
    cpu_sources = [f for f in ops if not f.endswith("_cuda.cpp")] + sorted(glob("csrc/cpu/*.cpp"))
    macros = [("TORCH_TARGET_VERSION", TORCH_TARGET_VERSION), ("Py_LIMITED_API", PY_LIMITED_API)]
    cxx = ["-O3", "-std=c++20", "-fvisibility=hidden"]
    if os.environ.get("LINREC_CONFIGS", "default") == "full":
        macros.append(("LINREC_FULL_CONFIGS", None))
    if not want_cuda():
        return [CppExtension("linrec._C", cpu_sources, define_macros=macros, extra_compile_args={"cxx": cxx},
                             py_limited_api=True)]

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_arch_list())
    major, minor = nvcc_version()
    archs = os.environ["TORCH_CUDA_ARCH_LIST"]
    # What the CUDA part was built for, also known to linrec._C: Python reads it before loading that part.
    built_for = [
        ("LINREC_CUDA_VERSION", f'"{major}.{minor}"'),
        ("LINREC_CUDA_ARCHS", '"' + archs.replace(" ", ";") + '"'),
    ]
    cpu = CppExtension("linrec._C", cpu_sources, define_macros=macros + built_for, extra_compile_args={"cxx": cxx},
                       py_limited_api=True)
    cuda_macros = macros + [
        ("LINREC_WITH_CUDA", None),
        ("USE_CUDA", None),  # declares the CUDA parts of the stable shim
    ] + built_for
    cuda_sources = ([f for f in ops if f.endswith("_cuda.cpp")] + sorted(glob("csrc/tuning/*.cpp"))
                    + sorted(glob("csrc/kernels/*.cu")) + sorted(glob("csrc/kernels/instances/*.cu")))
    nvcc = ["-O3", "-std=c++20", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"]
    cuda = CUDAExtension("linrec._C_cuda", cuda_sources, define_macros=cuda_macros, py_limited_api=True,
                         extra_compile_args={"cxx": cxx, "nvcc": nvcc})
    return [cpu, cuda]


setup(
    version=version(),
    package_dir={"": "python"},
    packages=["linrec", "linrec.impl", "linrec.models", "linrec.tuning"],
    package_data={"linrec": ["py.typed"], "linrec.tuning": ["*.json"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
