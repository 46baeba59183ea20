"""Off-chain agents: the client, trainer and challenger bots (honest and adversarial).

Each bot is a small state machine over the chain's views, fed by event polling (JSON-RPC log
queries by block range) and persisted in its own SQLite file, so a bot killed at any point and
restarted from the same file resumes its jobs and games (docs/agents.md).
"""
