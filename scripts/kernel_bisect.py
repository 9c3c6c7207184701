"""Time the Triton kernels of several trees of perfsim in one process, in ABBA order.

    python scripts/kernel_bisect.py --tree cur=. --tree 1bac840=/tmp/c-1bac840 ... \\
        [--sizes 16MB,256MB] [--ways triton] --csv out.csv

Each ``--tree LABEL=DIR`` is a checkout (``git archive SHA | tar -x -C DIR``) holding
``perfsim/`` and ``kernels/``. For every tree the package ``perfsim`` (with
``perfsim.kernels`` mapped to ``DIR/kernels``, as pyproject's package-dir does) is imported
afresh and ``benchmarks/bench_kernels.py`` of *this* tree times its public entries, so every
tree is measured by the same benchmark on the same machine. The trees run in the given order,
then in the reverse order (A B ... B A): a slow drift of the machine biases both passes in
opposite directions, and the two passes' spread says how large the drift was. Rows get the
columns ``tree`` and ``pass`` (1 or 2). One process: torch and CUDA start once.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location

HERE = os.path.dirname(os.path.abspath(__file__))


class _TreeFinder:
    """Maps ``perfsim``, ``perfsim.kernels`` and ``perfsim.calibrate`` to one tree."""

    root = None

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        sub = {"perfsim": "perfsim", "perfsim.kernels": "kernels", "perfsim.calibrate": "calibrate"}
        if cls.root is None:
            return None
        if fullname in sub:
            d = os.path.join(cls.root, sub[fullname])
            return spec_from_file_location(fullname, os.path.join(d, "__init__.py"),
                                           submodule_search_locations=[d])
        parent, _, _ = fullname.rpartition(".")
        if parent in sub:  # a module of the tree, or none (never another install's)
            spec = PathFinder.find_spec(fullname, [os.path.join(cls.root, sub[parent])])
            if spec is None:
                raise ModuleNotFoundError(f"No module named {fullname!r} in {cls.root}", name=fullname)
            return spec
        return None


def use_tree(root: str) -> None:
    """Make the next ``import perfsim...`` load the package of ``root`` (drops the loaded one)."""
    for name in [m for m in sys.modules if m == "perfsim" or m.startswith("perfsim.")]:
        del sys.modules[name]
    _TreeFinder.root = os.path.abspath(root)
    if _TreeFinder not in sys.meta_path:
        sys.meta_path.insert(0, _TreeFinder)


def _bench_module():
    path = os.path.join(HERE, "..", "benchmarks", "bench_kernels.py")
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--tree", action="append", required=True, help="LABEL=DIR (repeatable, in order)")
    ap.add_argument("--sizes", default="16MB,256MB")
    ap.add_argument("--ways", default="triton")
    ap.add_argument("--passes", type=int, default=2, choices=(1, 2), help="2: ABBA (default)")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for the torch ways")
    args = ap.parse_args(argv)
    trees = []
    for t in args.tree:
        label, sep, d = t.partition("=")
        if not sep or not os.path.isfile(os.path.join(d, "kernels", "__init__.py")):
            print(f"kernel_bisect: --tree {t!r}: expected LABEL=DIR with DIR/kernels/", file=sys.stderr)
            return 2
        trees.append((label, d))
    bench = _bench_module()
    device = args.device
    order = [(1, t) for t in trees] + ([(2, t) for t in reversed(trees)] if args.passes == 2 else [])
    rows = []
    for npass, (label, d) in order:
        use_tree(d)
        print(f"## tree {label} ({d}), pass {npass}", flush=True)
        for r in bench.run(args.sizes, device, tuple(args.ways.split(","))):
            rows.append(dict(r, tree=label, **{"pass": npass}))  # one pass per tree visit
        bench.write_csv(args.csv, rows)  # after every tree: a timeout keeps what was measured
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
