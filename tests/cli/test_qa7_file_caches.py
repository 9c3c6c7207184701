"""A file read through the API's caches is read again whenever it changed (qa7 finding F4).

The profile, topology, workload and config.json caches of :mod:`perfsim.api` were keyed on
(path, modification time), the input-key digests of :mod:`perfsim.provenance` on (path,
size, modification time): a file replaced by a copy that keeps an old modification time
(``cp -p``, ``rsync -t``, an unpacked archive: here ``os.utime``) was served from the cache.
A topology changed from 100 Mbps to 900 Mbps kept pricing 100 Mbps (gpt2-tiny pp 2: 0.180 s
an iteration instead of 0.022 s), and a sweep's stored rows kept the old file's key."""

import json
import os

import perfsim
from perfsim.analysis.sweep import input_key


def _rewrite(path, text: str) -> None:
    """Write ``text`` to ``path`` and give it back its earlier modification time."""
    st = os.stat(path)
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _topology(bw: str) -> str:
    return f'nodes = 2\nbandwidth = "{bw}"\nlatency = "1ms"\n'


def test_a_topology_replaced_under_its_old_modification_time_is_read_again(tmp_path):
    topo = tmp_path / "topo.toml"
    topo.write_text(_topology("100Mbps"))
    slow = perfsim.predict(model="gpt2-tiny", pp=2, topology=str(topo)).row()["iteration_s"]
    key = input_key(dict(model="gpt2-tiny", topology=str(topo)))
    _rewrite(topo, _topology("900Mbps"))
    fast = perfsim.predict(model="gpt2-tiny", pp=2, topology=str(topo)).row()["iteration_s"]
    flags = perfsim.predict(model="gpt2-tiny", pp=2, bandwidth="900Mbps", latency="1ms").row()["iteration_s"]
    assert fast == flags < slow / 3
    assert input_key(dict(model="gpt2-tiny", topology=str(topo))) != key
    _rewrite(topo, _topology("100Mbps"))  # back: the first key again (the digest is the content's)
    assert input_key(dict(model="gpt2-tiny", topology=str(topo))) == key


def test_a_config_json_replaced_under_its_old_modification_time_is_read_again(tmp_path):
    cfg = tmp_path / "config.json"
    doc = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 50257,
           "n_positions": 1024}
    cfg.write_text(json.dumps(doc))
    small = perfsim.predict(model=str(cfg), pp=2).row()["params"]
    _rewrite(cfg, json.dumps({**doc, "n_layer": 8}))
    assert perfsim.predict(model=str(cfg), pp=2).row()["params"] > small
