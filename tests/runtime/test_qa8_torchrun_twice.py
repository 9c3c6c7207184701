"""qa8: a user's script calling ``perfsim.runtime.run`` twice under torchrun.

torch resets its group counter when the default group is destroyed, so a second
``init_process_group`` over torchrun's agent store (``env://``) reads the first group's
gloo addresses under the same keys: the second run failed ("Connection reset by peer",
"Connection refused") or hung until killed. :func:`perfsim.rank_store.init_group` now
meets each time under a key prefix of its own. A script that holds a process group of its
own when it calls ``run`` gets one line (it was a ValueError traceback).
"""

import json
import subprocess
import sys
import textwrap


SCRIPT = textwrap.dedent("""
    import os, sys
    from perfsim.runtime import run
    for i in range(2):
        r = run(model="digits-mlp", pp=1, dp=2, grad_compress="qsgd-maxnorm:4", steps=2,
                out=f"{sys.argv[1]}/run{i}")
        # one write per line: both ranks share torchrun's stdout pipe, and print() writes its
        # arguments one by one, so two ranks' words could interleave ("rankrank 0 ...")
        sys.stdout.write(f"rank {os.environ['RANK']} run {i} done\\n"); sys.stdout.flush()
    import torch.distributed as dist
    from perfsim.errors import ConfigError
    dist.init_process_group("gloo")  # the script's own group: run() cannot join another
    try:
        run(model="digits-mlp", pp=1, dp=2, steps=2, out=f"{sys.argv[1]}/run2")
    except ConfigError as exc:
        sys.stdout.write(f"refused: {exc}\\n"); sys.stdout.flush()
    dist.destroy_process_group()
""")


def test_two_runs_in_one_torchrun_script(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for i in range(2):
        s = json.loads((tmp_path / f"run{i}" / "result.json").read_text())["summary"]
        assert s["source"] == "measured" and s["dp"] == 2 and s["steps"] == 2
        assert f"rank 1 run {i} done" in proc.stdout
    assert "terminate called" not in proc.stderr
    # a group of the script's own: one line naming it, nothing written (was: ValueError traceback,
    # "trying to initialize the default process group twice!")
    assert proc.stdout.count("refused:") == 2, proc.stdout + proc.stderr[-2000:]  # both ranks
    assert "dist.destroy_process_group()" in proc.stdout
    assert not (tmp_path / "run2").exists()
