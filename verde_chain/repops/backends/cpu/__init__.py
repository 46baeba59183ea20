"""The C++ CPU backend: ``extension.py`` (building the extension per ISA, entry points to its
kernels), ``backend.py`` (``CpuBackend``: planning and running nodes; the registry's ``backend``),
``jit.py`` (compiled maps), ``step.py`` (whole training steps in one call), ``codes.py`` (the fold
and binary codes shared with C++). The C++ sources are ``kernels/cpu/``. Nothing is imported
here, so ``codes`` stays free of torch."""
