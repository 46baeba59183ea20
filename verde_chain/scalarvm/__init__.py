"""ScalarVM off-chain side: the Python twins of the on-chain one-step machinery.

``softfloat`` is the twin of ``contracts/lib/SoftFloat32.sol`` (IEEE-754 binary32 in plain
integers); ``vm`` is the twin of ``contracts/ScalarVM.sol`` and does its arithmetic through
``softfloat.execute``.
"""
