"""The one-step machine's off-chain side: the Python twins of ``contracts/vm/``.

``softfloat`` is the twin of ``contracts/vm/SoftFloat32.sol`` (IEEE-754 binary32 in plain
integers); ``scalarvm`` is the twin of ``contracts/vm/ScalarVM.sol`` (states, one-step execution,
step proofs) and does its arithmetic through ``softfloat.execute``.
"""
