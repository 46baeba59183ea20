"""The dispute game's off-chain side: twins of ``contracts/dispute/``, players, worlds and the runner.

  types.py        twin of GameTypes.sol (phases, params, node reveals, the game view) and the moves
  bisection.py    twin of Bisection.sol (L1/L4 interval bisection, L2/L3 Merkle descent), move bounds
  clock.py        twin of Clock.sol (the chess clock)
  nodecheck.py    twin of NodeCheck.sol (the referee's L2 decision on a revealed node)
  world.py        the World protocol: every question the game asks about one execution
  kernel_world.py a small real-kernel job refereed by the real ScalarVM
  cheats.py       cheating trainers over a real training job, one per level
  players.py      honest and dishonest players (a World + a PlayStyle)
  runner.py       drives one game on chain between two players (the bots reuse it)

Everything but ``runner.py`` is pure (no web3); the web3 client is
``verde_chain.chain.dispute_client``. The real training job's World is
``verde_chain.graph.world.TrainingWorld``.
"""
