"""Imported first by the sweep pool's forkserver (``set_forkserver_preload``):
the forkserver dies with the sweep, and its pool workers with it (they ask
for that in their initializer), so a SIGKILLed sweep leaves no processes."""

from perfsim.procs import die_with_parent

die_with_parent()
