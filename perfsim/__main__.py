import sys

from perfsim.cli import main

code = main()
rank_store = sys.modules.get("perfsim.rank_store")
if rank_store is not None and rank_store.joined():
    # a rank (``perfsim run`` under torchrun): its group is destroyed and its outputs written;
    # leave without interpreter finalization, as perfsim's own ranks do (gloo's threads can
    # otherwise abort it: "terminate called without an active exception")
    from perfsim.procs import exit_rank

    exit_rank(code)
sys.exit(code)
