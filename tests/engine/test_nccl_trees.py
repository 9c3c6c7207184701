"""NCCL's double binary tree all-reduce: the trees NCCL builds (src/graph/trees.cc) and the bytes
each node moves through its NICs (src/device/all_reduce.h: each channel's share up its tree and
back down, half the channels on each tree): S on two nodes, 1.5 S on three, 2 S from four on."""

import pytest

from perfsim.collectives import TREE_EFFICIENCY, GroupShape, double_binary_tree, plan, tree_neighbours


def _edges(parents):
    return {(r, up) for r, up in enumerate(parents) if up >= 0}


def test_trees_are_the_ones_nccl_draws():
    """The three figures of NCCL's src/graph/trees.cc: the first tree on 14 ranks, its mirror on 12
    ranks (n even), its shift by one rank on 13 (n odd); every rank at most 2 children."""
    first14, _ = double_binary_tree(14)
    assert _edges(first14) == {(8, 0), (4, 8), (12, 8), (2, 4), (6, 4), (10, 12), (13, 12), (1, 2), (3, 2),
                               (5, 6), (7, 6), (9, 10), (11, 10)}
    _, mirror12 = double_binary_tree(12)
    assert mirror12[11] == -1 and _edges(mirror12) == {
        (3, 11), (1, 3), (7, 3), (5, 7), (9, 7), (0, 1), (2, 1), (4, 5), (6, 5), (8, 9), (10, 9)}
    _, shift13 = double_binary_tree(13)
    assert shift13[1] == -1 and _edges(shift13) == {
        (9, 1), (5, 9), (0, 9), (3, 5), (7, 5), (11, 0), (2, 3), (4, 3), (6, 7), (8, 7), (10, 11), (12, 11)}
    for n in range(2, 130):
        for parents in double_binary_tree(n):
            assert sorted(parents).count(-1) == 1
            assert max(list(parents).count(r) for r in range(n)) <= 2
    # a rank interior in one tree is a leaf in the other: at most 4 neighbours over both
    assert [tree_neighbours(n) for n in (2, 3, 4, 5, 8, 64, 127)] == [2, 3, 4, 4, 4, 4, 4]


@pytest.mark.parametrize("nodes, per_node", [(2, 1), (2, 8), (3, 8), (4, 8), (16, 1)])
def test_tree_moves_half_the_buffer_per_tree_neighbour(nodes, per_node):
    """A node's NICs carry S/2 per tree neighbour: S on two nodes (each the other's root and
    leaf), 1.5 S on three, 2 S from four; the NICs bind here (an ample intra-node fabric)."""
    S, nic = 64e6, 8 * 50e9
    g = GroupShape(nodes * per_node, nodes, per_node, 8 * 1e12, 0.0, nic, 0.0)
    tree = plan("allreduce", S, g, "tree")
    per_node_bytes = {2: S, 3: 1.5 * S}.get(nodes, 2 * S)
    (phase,), = tree.phases
    assert phase.inter_node and phase.volume_bytes == per_node_bytes
    assert tree.time() == pytest.approx(per_node_bytes * 8 / (TREE_EFFICIENCY * nic))


def test_the_node_chain_binds_when_the_nics_are_faster():
    """Inside a node each GPU of the chain relays S/2 up and S/2 down per tree: 2 S with three or
    more GPUs, S with two. Two nodes of 8 GPUs with NICs faster than half the fabric: the chain."""
    S, fabric = 64e6, 8 * 100e9
    g = GroupShape(16, 2, 8, fabric, 0.0, 8 * 80e9, 0.0)
    tree = plan("allreduce", S, g, "tree")
    assert tree.time() == pytest.approx(2 * S * 8 / (TREE_EFFICIENCY * fabric))
    assert tree.phases[0][0].volume_bytes == S  # the NICs still carry S
    two = GroupShape(4, 2, 2, fabric, 0.0, 8 * 80e9, 0.0)
    assert plan("allreduce", S, two, "tree").time() == pytest.approx(S * 8 / (TREE_EFFICIENCY * 8 * 80e9))
    one = GroupShape(8, 1, 8, fabric, 0.0, fabric, 0.0)
    assert plan("allreduce", S, one, "tree").time() == pytest.approx(2 * S * 8 / (TREE_EFFICIENCY * fabric))


def test_auto_picks_what_nccls_tuner_picks():
    """Large buffers: on two nodes the tree (S per node against the ring's 2(N-1)/N S; S. Jeaugey,
    NVIDIA/nccl#946: "NCCL should use Tree on 2 nodes for large sizes"); on three nodes the ring, as
    NCCL's tuner prices a tree there at 2 S per node although it moves 1.5 S -- a forced tree is
    priced at its 1.5 S."""
    S, nic = 128e6, 4 * 200e9 * 0.8
    two = GroupShape(16, 2, 8, 8 * 200e9, 0.0, nic, 0.0)
    assert plan("allreduce", S, two).algo == "tree"
    three = GroupShape(24, 3, 8, 8 * 200e9, 0.0, nic, 0.0)
    ring, tree = plan("allreduce", S, three, "ring"), plan("allreduce", S, three, "tree")
    assert tree.time() < ring.time()
    assert plan("allreduce", S, three) == ring
    four = GroupShape(32, 4, 8, 8 * 200e9, 0.0, nic, 0.0)
    assert plan("allreduce", S, four).algo == "ring"
