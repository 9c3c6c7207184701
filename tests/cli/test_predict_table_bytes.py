"""Every kind of bytes an iteration sends is shown and counted. The predict table had pipeline and dp bytes
only: a pipeline whose tied LM head is all-reduced between its stages read "dp bytes 0 B" although that
all-reduce is priced inside the dp sync; and plan's Pareto plot put such jobs (and TP jobs) at fewer bytes
than they send."""

import perfsim
from perfsim.commands._predict_table import render
from perfsim.result import SENT_BYTES_COLUMNS, bytes_sent
from perfsim.units import format_bytes

TIED = dict(model="gpt2-tiny", pp=2, micro_batch=4, macro_batch=8, bandwidth="1Gbps")


def test_a_tied_head_all_reduce_gets_its_own_column_in_both_tables():
    synced, untied = (perfsim.predict(**TIED, tied_embedding=t) for t in ("sync", "untied"))
    sent = synced.summary["tied_bytes"]
    assert sent > 0 and synced.summary["dp_bytes"] == 0  # the case the table hid
    grid = render([synced, untied], width=220, color=False)
    header = next(line for line in grid.splitlines() if "dp bytes" in line)
    assert "tied bytes" in header and " tied " in header  # and the setting that tells the two rows apart
    cells = [line.split("│")[-2].strip() for line in grid.splitlines() if line.count("│") > 3]
    assert cells[-2:] == [format_bytes(sent), format_bytes(0)]  # the synced row, then the untied one
    one = render([synced], width=220, color=False)
    assert any("tied bytes" in line and format_bytes(sent) in line for line in one.splitlines())


def test_no_column_for_bytes_no_configuration_sends():
    text = render([perfsim.predict(bandwidth="100Mbps")], width=220, color=False)
    assert "tied bytes" not in text and "tp bytes" not in text and "ep bytes" not in text


def test_bytes_sent_counts_every_kind_once():
    summary = {k: 10 ** i for i, k in enumerate(SENT_BYTES_COLUMNS)}
    assert bytes_sent(summary) == sum(10 ** i for i in range(len(SENT_BYTES_COLUMNS)))
    assert bytes_sent({"pipeline_bytes": 5, "tp_bytes": None}) == 5  # a measured summary: no TP column
    tp = perfsim.predict(model="gpt2-tiny", pp=2, tp=2, bandwidth="1Gbps").summary
    assert tp["tp_bytes"] > 0 and bytes_sent(tp) == tp["pipeline_bytes"] + tp["dp_bytes"] + tp["tp_bytes"] \
        + tp["ep_bytes"] + tp["tied_bytes"]


def test_a_piped_grid_table_keeps_every_cell_whole():
    """With the tied-bytes column an 8-row grid needs ~150 columns; piped, rich cut cells to fit 140 ("host_ove…",
    "36.1ms-…": the interval's upper end lost). Without a terminal to fit, the table keeps its own width."""
    import io

    results = [perfsim.predict(**dict(TIED, micro_batch=2), gpu=g, host_overhead=h)
               for g in ("a100", "h100") for h in ("10us", "20us")]
    labels = [{"gpu": g, "host_overhead": h} for g in ("a100", "h100") for h in ("10us", "20us")]
    out = io.StringIO()  # not a tty: a pipe or a file
    render(results, file=out, labels=labels)
    table = out.getvalue()
    assert "…" not in table and "host_overhead" in table, table
    assert max(map(len, table.splitlines())) > 140  # wider than the text's 140, not cut to it
