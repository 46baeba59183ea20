"""Off-chain side of the dispute game: rules (twins of the Solidity libraries), a toy machine and
world for tests, and honest/dishonest players that compute moves from a "truth" (a World)."""
