"""Calibration profiles: measured costs the simulator is fed with.

Two halves: :mod:`perfsim.profile.format` (the file: schema, typed record
fields, load/save, version migration) and :mod:`perfsim.profile.costs` (the
queries over one alpha-beta fit). :class:`Profile` is both; the format's
reference is ``docs/profile-format.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfsim.profile.costs import Fit, ProfileCosts, fit_alpha_beta, name_chain
from perfsim.profile.format import (BASE_OPS, CODEC_OPS, COMM_OPS, COMPUTE_OPS, CORE_COLUMNS,
                                    DEFAULT_PROFILE, EFFICIENCY_OPS, FACTS, FORMAT, KNOWN_OPS,
                                    OTHER_OPS, RECORD_COLUMNS, SUPPORTED_VERSIONS, VERSION,
                                    ProfileFile, check_record, default_profile_path, shape_text)

__all__ = ["Profile", "load_profile", "profile_path", "Fit", "fit_alpha_beta", "name_chain", "default_profile_path",
           "shape_text", "check_record", "ProfileFile", "ProfileCosts", "FORMAT", "VERSION",
           "SUPPORTED_VERSIONS", "RECORD_COLUMNS", "CORE_COLUMNS", "FACTS", "KNOWN_OPS", "BASE_OPS",
           "COMPUTE_OPS", "CODEC_OPS", "COMM_OPS", "OTHER_OPS", "EFFICIENCY_OPS", "DEFAULT_PROFILE"]


class Profile(ProfileFile, ProfileCosts):
    """A loaded, validated profile (:class:`ProfileFile`) and its cost queries
    (:class:`ProfileCosts`)."""

    #: hashed by identity (the dataclass's value equality left it unhashable): a planner's
    #: candidates key their groups on their parameters, a Profile given to ``perfsim.plan`` among them
    __hash__ = object.__hash__

    def forget(self) -> None:
        """Drop what the queries memoised (the record index of :meth:`select`, the fits of
        :meth:`fit`, the calibrated links of :meth:`perfsim.link.Link.calibrated`): all are keyed
        on the record count, so records edited or replaced in place would be priced as before
        (qa7). The API calls it on a Profile it is given."""
        for memo in ("_by_op", "_fit_cache", "_link_cache"):
            self.__dict__.pop(memo, None)


def load_profile(spec: str | os.PathLike | Profile | None) -> Profile:
    """A Profile from a path, an already-loaded Profile, or None (the default)."""
    if isinstance(spec, Profile):
        return spec
    return Profile.load(profile_path(spec))


def profile_path(spec: str | os.PathLike | None) -> Path:
    """The file :func:`load_profile` reads for ``spec``: the default profile for None,
    a path, or a bare name (shipped names, ``traces/NAME.json``, package data)."""
    if spec is None or spec == "" or spec == "default":
        return default_profile_path()
    p = Path(spec)
    if not p.exists() and not p.suffix:
        # a bare name such as "default-v100-aqsgd": shipped names, traces/ and package data
        from perfsim.packaged import DATA, NAMES  # lazy: perfsim predict does not load perfsim.packaged

        if str(spec) in NAMES["profile"]:
            return DATA / NAMES["profile"][str(spec)]
        for folder in (default_profile_path().parent, Path(__file__).resolve().parents[2] / "traces"):
            if (folder / f"{spec}.json").exists():
                return folder / f"{spec}.json"
    return p
