import pytest
import torch

import linrec
from linrec.impl import python as py_impl

HAS_GPU = torch.cuda.is_available()
HAS_CUDA_KERNELS = HAS_GPU and linrec.build_info()["cuda"]

# Implementations that run on the CPU: name -> callable with linrec.linrec's signature.
CPU_IMPLS = {
    "linrec": linrec.linrec,
    "python.linrec_ref": py_impl.linrec_ref,
    "python.linrec_hop": py_impl.linrec_hop,
}


def gpu_impls():
    if not HAS_CUDA_KERNELS:
        return {}
    from linrec.impl import cuda

    return {
        "linrec": linrec.linrec,
        "cuda.linrec_ref": cuda.linrec_ref,
        "cuda.linrec_tile": cuda.linrec_tile,
        "cuda.linrec_pipe": cuda.linrec_pipe,
    }


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a build with CUDA kernels")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA_KERNELS:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
