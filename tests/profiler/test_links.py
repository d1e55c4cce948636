"""`hetpart profile-link` (NOTE [measured links] in hetpart/profiler/links.py)."""

from __future__ import annotations

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.partitioner.costs import allreduce_ns, transfer_ns
from hetpart.partitioner.problem import Link
from hetpart.profiler.links import fit_link, measure_link

SIZES = (4096, 65536, 262144, 1048576, 4194304)


@pytest.mark.parametrize("op,ranks", [("all-reduce", 2), ("all-reduce", 4), ("send-recv", 2)])
def test_the_fit_recovers_the_link_that_made_the_times(op, ranks):
    # Times made by the cost model's own formulas for a known link: the fit must give that link back.
    link = Link(bandwidth_bytes_per_us=1700, latency_ns=350_000)  # 1.7 GB/s, 350 us
    cost = (lambda n: allreduce_ns(link, n, ranks)) if op == "all-reduce" else (lambda n: transfer_ns(link, n))
    fit = fit_link(op, ranks, {n: cost(n) / 1000 for n in SIZES})
    assert fit.latency_us == pytest.approx(350, rel=1e-3) and fit.bandwidth_gbps == pytest.approx(1.7, rel=1e-3)
    assert all(fit.fitted_us[n] == pytest.approx(cost(n) / 1000, rel=1e-3) for n in SIZES)
    assert fit.toml() == "link = { bandwidth_GBps = 1.7, latency_us = 350 }"


def test_times_that_do_not_grow_with_the_size_are_refused():
    with pytest.raises(HetpartError, match="do not grow with the size"):
        fit_link("all-reduce", 2, {4096: 900.0, 4194304: 800.0})


def test_a_real_measurement_between_two_processes():
    # 64 MiB (tens of ms over loopback) against 1 KiB, median of 5: at load 16 a median of 3 sends of 1 KiB took
    # 11.5 ms, more than 8 MiB's 4.3 ms, and the fit was (rightly) refused
    fit = measure_link("send-recv", 2, sizes=(1024, 64 << 20), repeats=5)
    assert set(fit.measured_us) == {1024, 64 << 20} and fit.bandwidth_gbps > 0 and fit.latency_us >= 0
    assert fit.measured_us[64 << 20] > fit.measured_us[1024]


def test_bad_arguments_exit_2(capsys):
    assert main(["profile-link", "--op", "send-recv", "--ranks", "3"]) == 2
    assert "send-recv needs exactly 2" in capsys.readouterr().err
    assert main(["profile-link", "--ranks", "1"]) == 2  # argparse's range check


def test_between_work_each_call_is_timed_after_the_matmuls(capsys):
    # NOTE [collectives between work]: one 2-process run, sizes far apart so that the slow mode of the small
    # size's calls (a few ms) stays below the large one's transfer and the fit is made.
    assert main(["profile-link", "--gap-us", "100", "--sizes", "4096", str(32 << 20), "--repeats", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table's title wraps at the terminal's width
    assert "gloo all-reduce among 2 local processes (mean of 3, each after 100 us of matmuls)" in out
    assert "link = { bandwidth_GBps = " in out


def test_a_negative_gap_is_refused(capsys):
    assert main(["profile-link", "--gap-us", "-1"]) == 2  # argparse's range check
    assert "profile-link: --gap-us must be >= 0 (got -1)" in capsys.readouterr().err
    with pytest.raises(HetpartError, match="--gap-us -1: give 0"):  # the API's own check, before any process
        measure_link(gap_us=-1)
