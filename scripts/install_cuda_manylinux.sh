#!/usr/bin/env bash
# The CUDA compiler and runtime headers inside a manylinux_2_28 (AlmaLinux 8) container, from
# NVIDIA's rhel8 repository (scripts/build_wheel.sh runs it with LINREC_INSTALL_CUDA=1).
# CUDA_VERSION is e.g. 12.6 or 13.0.
set -euo pipefail
: "${CUDA_VERSION:?set CUDA_VERSION, e.g. 13.0}"
pkg=${CUDA_VERSION/./-}
arch=$(uname -m); [ "$arch" = aarch64 ] && arch=sbsa
dnf install -y dnf-plugins-core
dnf config-manager --add-repo "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${arch}/cuda-rhel8.repo"
dnf install -y "cuda-nvcc-${pkg}" "cuda-cudart-devel-${pkg}" "cuda-crt-${pkg}" || dnf install -y "cuda-nvcc-${pkg}" "cuda-cudart-devel-${pkg}"
ln -sfn "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
