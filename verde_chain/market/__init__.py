"""The job market's off-chain side: the pure twins of ``contracts/market/JobTypes.sol`` (``types``)
and ``contracts/market/MarketParams.sol`` (``marketparams``, with the deployment profiles).

The web3 client of ``JobMarket.sol`` is ``verde_chain.chain.market_client``; the off-chain job a
posted job commits to (spec, model, data) is ``verde_chain.job``.
"""
