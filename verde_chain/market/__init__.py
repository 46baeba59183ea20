"""The job market's off-chain side: the pure twin of ``contracts/market/JobTypes.sol`` (``types``).

The web3 client of ``JobMarket.sol`` is ``verde_chain.chain.market_client``; the off-chain job a
posted job commits to (spec, model, data) is ``verde_chain.job``.
"""
