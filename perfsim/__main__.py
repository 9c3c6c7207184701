import os
import sys

from perfsim.cli import main

code = main()
if "torch.distributed" in sys.modules and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # a torchrun rank (``perfsim run`` under torchrun): its group is destroyed and its outputs
    # written; leave without interpreter finalization, as perfsim's own ranks do (gloo's
    # threads can otherwise abort it: "terminate called without an active exception")
    from perfsim.procs import exit_rank

    exit_rank(code)
sys.exit(code)
