"""The commitment library deployed and called through ape (ape-foundry on the npm anvil)."""

from verde_chain.commit import merkle


def test_merkle_root_through_ape(project, accounts):  # type: ignore[no-untyped-def]
    harness = accounts[0].deploy(project.MerkleHarness)
    leaves = [bytes([i]) * 32 for i in range(1, 6)]
    assert bytes(harness.root(leaves)) == merkle.merkle_root(leaves)
    proof = merkle.merkle_proof(leaves, 3)
    assert harness.verify(merkle.merkle_root(leaves), leaves[3], 3, 5, proof) is True
