"""``perfsim.plan`` takes a loaded Profile as ``perfsim.predict`` does (qa7 finding F9).

``perfsim.plan(profile=Profile.load(PATH), ...)`` ended in ``TypeError: unhashable type:
'Profile'`` (the search keys its groups on the candidates' parameters)."""

from pathlib import Path

import perfsim
from perfsim.profile import Profile

PATH = str(Path(__file__).resolve().parents[2] / "traces" / "cpu-2core.json")


def test_plan_takes_a_profile_object_and_ranks_as_with_its_file():
    job = dict(model="gpt2-tiny", nodes=2, global_batch=32, bandwidth="100Mbps", jobs=1, top=3)
    mine = perfsim.plan(profile=Profile.load(PATH), **job).to_frame()
    theirs = perfsim.plan(profile=PATH, **job).to_frame()
    assert mine["iteration_s"].tolist() == theirs["iteration_s"].tolist()
    assert mine["pp"].tolist() == theirs["pp"].tolist()
