"""The measured last-level cache: the edge rule, the sweep's stopping rule, the probe on this host, its
cache, and the analytic prior's use of it."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from compiler.target import Target
from cost_model import llc_probe
from cost_model.store_features import Machine

MIB = 1 << 20
GB = 1e9
# best rates (bytes per second) of the sweep on the development Xeon (2 vCPUs of a 480 MiB L3) and the shape
# of an AMD host whose core reaches one CCD's 32 MiB L3
XEON = {s * MIB: r * GB for s, r in ((8, 58.7), (16, 58.8), (32, 58.8), (64, 52.5), (128, 36.7), (256, 32.8))}
CCD = {s * MIB: r * GB for s, r in ((4, 90), (8, 88), (16, 80), (32, 35), (64, 26), (128, 25))}


def test_edge_is_where_the_rate_crosses_the_mean_of_cache_and_dram():
    xeon = llc_probe.llc_from_rates(XEON)
    assert 64 * MIB < xeon < 128 * MIB  # between the last size near the cached rate and the first near DRAM
    assert abs(xeon / MIB - 91) < 2  # log-log interpolation: sqrt(58.7 x 32.8) = 43.9 GB/s at ~91 MiB
    ccd = llc_probe.llc_from_rates(CCD)
    assert 16 * MIB < ccd < 32 * MIB
    # a cache twice as large, the same curve shape at twice the sizes: twice the edge
    wider = {int(s * 2): r for s, r in CCD.items()}
    assert llc_probe.llc_from_rates(wider) == pytest.approx(2 * ccd, rel=1e-6)


def test_no_edge_in_range_is_none_so_the_guess_stays():
    flat = {s: 50 * GB for s in XEON}  # all cached (or all DRAM): nothing to read an edge from
    assert llc_probe.llc_from_rates(flat) is None
    shallow = {s: r * (1.0 if s < 64 * MIB else 0.8) for s, r in XEON.items() if s <= 64 * MIB}
    assert llc_probe.llc_from_rates(shallow) is None  # falls less than MIN_DROP
    assert llc_probe.llc_from_rates({8 * MIB: 50 * GB}) is None
    assert llc_probe.llc_from_rates({}) is None
    assert llc_probe.llc_from_rates({8 * MIB: 0.0, 16 * MIB: 0.0}) is None


def test_the_sweep_stops_on_the_dram_plateau():
    rates = {}
    for size, rate in XEON.items():
        rates[size] = rate
        stop = llc_probe.on_plateau(rates)
        assert stop == (size == 256 * MIB), size  # 128 and 256 MiB: both 1.5x below, within 0.8 of each other
    still_falling = {8 * MIB: 60 * GB, 16 * MIB: 35 * GB, 32 * MIB: 20 * GB}
    assert not llc_probe.on_plateau(still_falling)
    assert not llc_probe.on_plateau({8 * MIB: 60 * GB, 16 * MIB: 30 * GB})  # needs two sizes past the first


def test_sizes_start_clear_of_l2_and_double_to_the_limit():
    sizes = llc_probe.sweep_sizes(2 * MIB, 1 << 30)
    assert sizes[0] == 8 * MIB and sizes[-1] == 1 << 30
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert llc_probe.sweep_sizes(1280 << 10, 64 * MIB)[0] == 8 * MIB  # 4 x 1.25 MiB, up to a power of two
    assert llc_probe.sweep_sizes(2 * MIB, 4 * MIB) == []


def test_measure_rates_times_each_size_and_stops_at_the_plateau():
    calls = []

    def sweep(buf, passes):  # a machine whose rate by size is XEON's
        size = buf.nbytes
        calls.append((size, passes))
        return 2.0 * size * passes / XEON[size]

    sizes = llc_probe.sweep_sizes(2 * MIB, 1 << 30)
    rates = llc_probe.measure_rates(sweep, sizes)
    assert list(rates) == list(XEON)  # stopped after 256 MiB, not at 1 GiB
    assert all(rates[s] == pytest.approx(XEON[s]) for s in rates)
    for size, passes in calls:
        assert size * passes >= llc_probe.SWEEP_BYTES or passes == 1
    assert llc_probe.llc_from_rates(rates) == llc_probe.llc_from_rates(XEON)


def test_probe_measures_this_host_once_and_every_process_reads_its_file(fresh_probes, monkeypatch):
    host = Target.host()
    llc = llc_probe.host_llc_bytes(host)
    stored = json.loads(llc_probe.probe_path().read_text())
    assert [p.name for p in llc_probe.probe_path().parent.iterdir()] == [llc_probe.probe_path().name]
    rates = {int(s): r for s, r in stored["rates"].items()}
    sizes = sorted(rates)
    assert sizes == llc_probe.sweep_sizes(host.l2_bytes, sizes[-1]) and len(sizes) >= 2
    assert all(r > 0 for r in rates.values())
    if stored["llc_bytes"] is None:
        assert llc == llc_probe.guessed_llc_bytes(host)
    else:
        assert llc == stored["llc_bytes"] and sizes[0] < llc < sizes[-1]
    llc_probe._host_result.cache_clear()  # a second process reads the file, it does not sweep again
    monkeypatch.setattr(llc_probe, "_measure", lambda: pytest.fail("measured again"))
    assert llc_probe.host_llc_bytes(host) == llc


def test_first_written_answer_wins_and_a_damaged_file_is_named(fresh_probes, monkeypatch, caplog):
    path = llc_probe.probe_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"llc_bytes": 96 * MIB, "rates": {}, "host": "another process"}))
    monkeypatch.setattr(llc_probe, "_measure", lambda: pytest.fail("measured although a result exists"))
    host = Target.host()
    assert llc_probe.host_llc_bytes(host) == 96 * MIB
    for damaged in ("{not json", json.dumps({"llc_bytes": -4}), json.dumps({"rates": {}})):
        llc_probe._host_result.cache_clear()
        caplog.clear()
        path.write_text(damaged)
        assert llc_probe.host_llc_bytes(host) == llc_probe.guessed_llc_bytes(host)  # the model never stops
        assert str(path) in caplog.text and "delete it" in caplog.text


def test_no_edge_found_keeps_the_guess(fresh_probes, monkeypatch):
    host = Target.host()
    monkeypatch.setattr(llc_probe, "_measure", lambda: {"llc_bytes": None, "rates": {}, "host": host.key})
    guess = llc_probe.guessed_llc_bytes(host)
    assert llc_probe.host_llc_bytes(host) == guess == max(16 * host.l2_bytes, 32 * MIB)


def test_other_cpus_get_the_guess_and_the_prior_uses_the_measured_size_here(fresh_probes, monkeypatch):
    host = Target.host()
    monkeypatch.setattr(llc_probe, "_measure", lambda: {"llc_bytes": 96 * MIB, "rates": {}, "host": host.key})
    other = dataclasses.replace(host, device="Some Other CPU 9000")
    assert Machine.of(other).l3 == llc_probe.guessed_llc_bytes(other)
    assert Machine.of(host).l3 == 96 * MIB
    one_thread = dataclasses.replace(host, cores=1)  # the benchmark's target: this CPU, one thread
    assert Machine.of(one_thread).l3 == 96 * MIB
    assert Machine.of(Target.cuda()).l3 == Target.cuda().l2_bytes  # a GPU's last level is its L2
