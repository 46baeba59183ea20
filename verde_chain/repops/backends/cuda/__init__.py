"""The CUDA backend: ``extension.py`` (building the kernels of ``kernels/cuda/``), ``backend.py``
(``CudaBackend``; the registry's ``backend``, a ``CudaRunner``), ``step.py`` (whole training steps
on the device)."""
