"""An OpenZeppelin ERC-20 (contracts/test/TestToken.sol) compiled by ape-solidity and used through ape."""


def test_oz_erc20_through_ape(project, accounts):  # type: ignore[no-untyped-def]
    owner, other = accounts[0], accounts[1]
    token = owner.deploy(project.TestToken)
    assert token.symbol() == "VTT" and token.decimals() == 18
    assert token.balanceOf(other) == 0
    token.mint(other, 10**21, sender=owner)
    assert token.balanceOf(other) == 10**21
    token.transfer(owner, 4 * 10**20, sender=other)
    assert token.balanceOf(other) == 6 * 10**20
    assert token.balanceOf(owner) == 4 * 10**20
    assert token.totalSupply() == 10**21
