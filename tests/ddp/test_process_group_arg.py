"""``CompressionState(spec, process_group=...)`` takes a torch.distributed ProcessGroup or None;
anything else (a group's name, a rank list) was accepted and failed later inside ``backward()``."""

import pytest

from perfsim.ddp import CompressionState
from perfsim.errors import ConfigError


@pytest.mark.parametrize("group", ["world", [0, 1], 2])
def test_a_process_group_that_is_not_one_is_refused_at_once(group):
    with pytest.raises(ConfigError, match=r"^process_group=.*expected a torch.distributed ProcessGroup or None"):
        CompressionState("ecq:4", process_group=group)


def test_none_takes_the_ddp_models_group():
    assert CompressionState("ecq:4").process_group is None
