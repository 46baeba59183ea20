"""Everything that talks to a chain, and nothing else does (web3 only): solc compilation, a local
Anvil, deployment, transactions and calls, revert decoding (``revert.py``: into
``verde_chain.errors.ContractRevert``), and the typed clients of ``contracts/dispute/DisputeGame.sol``
(``dispute_client.py``) and ``contracts/market/JobMarket.sol`` (``market_client.py``). The data
they send and read are the pure types of ``verde_chain.dispute.types`` and ``verde_chain.market.types``."""
