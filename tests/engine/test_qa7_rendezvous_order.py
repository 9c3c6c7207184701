"""Rendezvous p2p does not hold a posted receive's message behind one not yet posted (qa7 F8).

gloo's TCP pairs are receiver-driven per receive (a send goes once its own receive is posted,
whatever else waits on the pair); the flow model kept one FIFO per device pair, so ZB-V, whose
device 0 sends F2 before B0 while device 1 receives B0 before F2, stopped every device:
``perfsim predict --schedule zb-v --p2p-protocol rendezvous`` ended in a RuntimeError traceback
("the devices wait for each other")."""

import pytest

import perfsim


def test_zb_v_runs_over_a_rendezvous_link():
    job = dict(model="gpt2-small-byte", pp=2, schedule="zb-v", bandwidth="1Gbps", latency="1ms")
    eager = perfsim.predict(**job).row()["iteration_s"]
    rdv = perfsim.predict(**job, p2p_protocol="rendezvous").row()["iteration_s"]
    assert eager <= rdv < 3 * eager  # the receiver's ready notice costs a little, never a deadlock


def test_a_real_deadlock_is_said_in_one_line():
    """Megatron's blocking exchanges over a rendezvous link do wait for each other on ZB-V (a send
    completes only once its receive is posted, which the peer does in a later exchange): a
    ConfigError naming the two settings, not a RuntimeError traceback."""
    job = dict(model="gpt2-small-byte", pp=2, schedule="zb-v", bandwidth="1Gbps", latency="1ms",
               p2p_exchange="blocking")
    assert perfsim.predict(**job).row()["iteration_s"] > 0  # eager: runs
    with pytest.raises(perfsim.ConfigError, match="p2p_exchange blocking .* rendezvous"):
        perfsim.predict(**job, p2p_protocol="rendezvous")
