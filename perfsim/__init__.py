"""perfsim: a network-aware simulator and real-cluster performance modeller for
distributed training with communication compression.

Read the code in the order given in README.md ("Read the code in this order").
"""

__version__ = "0.1.0"

from perfsim.errors import ConfigError  # noqa: E402

__all__ = ["__version__", "ConfigError"]
