"""Examples shipped inside the package (``perfsim/data/``), found by name.

``perfsim predict --profile default-v100 --topology example-geo --workload
example-workload`` works from an installed wheel: a value that is not an
existing file and has no suffix is looked up here. Formats: docs/formats.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfsim.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data"
#: short names of the shipped files, by kind (name -> file in perfsim/data)
NAMES = {
    "profile": {"default-v100": "default-v100-aqsgd.json",
                "default-v100-aqsgd": "default-v100-aqsgd.json"},
    "topology": {"example-geo": "example-geo-topology.toml"},
    "workload": {"example-workload": "example-workload.toml"},
}


def resolve(kind: str, value: str | os.PathLike) -> Path:
    """``value`` as a path: an existing file, else a shipped example's name
    (ConfigError naming ``kind`` and the known names when neither)."""
    path = Path(value)
    if path.exists():
        return path
    shipped = NAMES[kind].get(str(value))
    if shipped is not None and (DATA / shipped).exists():
        return DATA / shipped
    known = ", ".join(NAMES[kind])
    raise ConfigError(f"{kind} {str(value)!r}: no such file (shipped {kind} names: {known})")
