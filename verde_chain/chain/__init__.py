"""Chain lifecycle: solc compilation, a local Anvil, deployment, typed calls and decoded reverts."""
