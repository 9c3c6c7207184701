"""The grid table's time column is the run asked for (``--epochs``, warm-up included). It showed
the steady epoch: AQ-SGD at 100 Mbps read 619 s where a one-epoch run, all uncompressed warm-up
(AQ-SGD's first epoch sends whole activations), takes 2.04e3 s."""

import perfsim
from perfsim.commands._predict_table import render
from perfsim.units import format_time


def test_the_grid_shows_each_runs_total_not_its_steady_epoch():
    results = [perfsim.predict(bandwidth="100Mbps", compress=c) for c in ("fp32", "aqsgd:fw3bw6")]
    aq = results[1].summary
    assert aq["warmup_iterations"] and aq["total_s"] > 2 * aq["epoch_s"]  # the case the column hid
    text = render(results, width=200, color=False)
    header = next(line for line in text.splitlines() if "compress" in line)
    assert " run " in header and "epoch" not in header
    row = next(line for line in text.splitlines() if "aqsgd" in line)
    assert format_time(aq["total_s"]) in row and format_time(aq["epoch_s"]) not in row
