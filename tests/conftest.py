import glob
import os

# Without a GPU, the Triton kernels run in Triton's interpreter on CPU tensors.
# It must be chosen before triton is imported.
if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import linrec  # noqa: E402
from linrec.impl import python as py_impl  # noqa: E402

HAS_GPU = torch.cuda.is_available()
HAS_CUDA_KERNELS = HAS_GPU and linrec.build_info()["cuda"]

# With pytest-xdist on a machine of several GPUs, each worker makes one of them current (tests
# ask for "cuda"), so the suite spreads over all of them and runs on devices other than cuda:0.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if HAS_GPU and _worker.startswith("gw") and torch.cuda.device_count() > 1:
    torch.cuda.set_device(int(_worker[2:]) % torch.cuda.device_count())

# Implementations that run on the CPU: name -> callable with linrec.linrec's signature.
CPU_IMPLS = {
    "linrec": linrec.linrec,
    "python.linrec_ref": py_impl.linrec_ref,
    "python.linrec_hop": py_impl.linrec_hop,
}


def gpu_impls():
    if not HAS_CUDA_KERNELS:
        return {}
    from linrec.impl import cuda, triton

    return {
        "linrec": linrec.linrec,
        "cuda.linrec_ref": cuda.linrec_ref,
        "cuda.linrec_tile": cuda.linrec_tile,
        "cuda.linrec_pipe": cuda.linrec_pipe,
        "cuda.linrec_chained": cuda.linrec_chained,
        "cuda.linrec_strided": cuda.linrec_strided,
        "cuda.linrec_packed": cuda.linrec_packed,
        "triton.linrec_tile": triton.linrec_tile,
        "triton.linrec_pipe": triton.linrec_pipe,
    }


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a build with CUDA kernels")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA_KERNELS:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
