# The catalog's PyTorch image for GPU hosts: the CUDA build of the same PyTorch as gpucloud/pytorch:2.13.0-cpu,
# with the same PyTorch Lightning and NumPy, every other package pinned by pytorch-cpu.txt. NOT BUILT OR RUN on the
# development machines (they reach neither download.pytorch.org nor a GPU): README "Images", "GPU hosts".
#
# PyTorch's CUDA wheels carry their CUDA runtime, cuDNN and NCCL (the nvidia-* packages torch pins exactly), so
# the image needs no CUDA base image: the project's own Debian base is enough, and the host's NVIDIA driver
# comes in through the NVIDIA Container Toolkit at run time. On a machine that reaches download.pytorch.org
# and PyPI (a build host; no GPU needed to build):
#
#   python -m agent.framework_images gpucloud/python:3.11-bookworm        # the base, from Debian (mmdebstrap)
#   docker build --network host -f config/images/pytorch-cuda.Dockerfile \
#     -t $REGISTRY/gpucloud/pytorch:2.13.0-cu130 config/images
#   docker push $REGISTRY/gpucloud/pytorch:2.13.0-cu130
#
# then add it to the catalog (admin, Images: name "PyTorch 2.13.0 / CUDA 13.0", framework PyTorch, version
# 2.13.0, CUDA 13.0, Python 3.11, that reference). Another CUDA line: --build-arg CUDA=cu128 (and tag it so);
# check first that download.pytorch.org/whl/<CUDA>/torch/ lists torch-2.13.0+<CUDA>-cp311.
ARG BASE=gpucloud/python:3.11-bookworm
FROM ${BASE}
ARG TORCH=2.13.0
ARG CUDA=cu130
COPY pytorch-cpu.txt /tmp/pins.txt
# Everything but torch exactly as in the CPU image; torch and what only its CUDA build needs (nvidia-*, triton)
# from PyTorch's index, at the versions that torch release pins.
RUN grep -v '^torch==' /tmp/pins.txt > /tmp/constraints.txt \
 && pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${CUDA}" \
      --extra-index-url https://pypi.org/simple -c /tmp/constraints.txt "torch==${TORCH}+${CUDA}" \
 && pip install --no-cache-dir -r /tmp/constraints.txt \
 && rm /tmp/pins.txt /tmp/constraints.txt \
 && python -c "import torch, pytorch_lightning; print(torch.__version__, torch.version.cuda, pytorch_lightning.__version__)"
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.gpucloud.recipe="config/images/pytorch-cuda.Dockerfile torch==${TORCH}+${CUDA}"
