"""The measured FMA datapath: the decision rule, the probe on this host, its cache, the cost model's use."""

from __future__ import annotations

import dataclasses
import json

import pytest

from compiler.backends.cpu import datapath
from compiler.target import Target
from cost_model.store_features import Machine


def test_rule_takes_each_doubling_that_doubles_the_rate():
    full = {4: 1.0, 8: 2.0, 16: 4.0}
    split_512 = {4: 1.0, 8: 2.0, 16: 2.1}  # Zen 4: a 512-bit FMA as two 256-bit halves
    split_256 = {4: 1.0, 8: 1.1}  # Zen 1: a 256-bit FMA as two 128-bit halves
    assert datapath.datapath_from_rates(full, 16) == 16
    assert datapath.datapath_from_rates(full, 8) == 8  # never wider than the target's registers
    assert datapath.datapath_from_rates(split_512, 16) == 8
    assert datapath.datapath_from_rates(split_256, 8) == 4
    assert datapath.datapath_from_rates({4: 1.0}, 4) == 4
    assert datapath.datapath_from_rates({4: 1.0, 8: 1.3, 16: 2.6}, 16) == 4  # stops at the first miss


def test_probe_measures_this_host_once_and_every_process_reads_its_file(fresh_probes, monkeypatch):
    host = Target.host()
    lanes = datapath.host_datapath_lanes(host)
    assert lanes in datapath.WIDTHS and lanes <= host.vector_lanes_f32
    path = datapath.probe_path()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
    stored = json.loads(path.read_text())
    assert stored["datapath_lanes"] == lanes
    rates = {int(w): r for w, r in stored["rates"].items()}
    assert set(rates) == {w for w in datapath.WIDTHS if w <= host.vector_lanes_f32}
    # a wider width never runs fewer lanes per second than half of it (it is at worst split in two)
    for w in rates:
        if w // 2 in rates:
            assert rates[w] > 0.7 * rates[w // 2]
    # a second process (a cleared memo) reads the file, it does not measure again
    datapath._host_result.cache_clear()
    monkeypatch.setattr(datapath, "_measure", lambda: pytest.fail("measured again"))
    assert datapath.host_datapath_lanes(host) == lanes


def test_first_written_answer_wins_and_a_damaged_file_is_named(fresh_probes, monkeypatch, caplog):
    path = datapath.probe_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"datapath_lanes": 4, "rates": {}, "host": "another process"}))
    monkeypatch.setattr(datapath, "_measure", lambda: pytest.fail("measured although a result exists"))
    assert datapath.host_datapath_lanes(Target.host()) == 4
    datapath._host_result.cache_clear()
    path.write_text("{not json")
    host = Target.host()
    assert datapath.host_datapath_lanes(host) == host.vector_lanes_f32  # the cost model never stops
    assert str(path) in caplog.text and "delete it" in caplog.text


def test_other_cpus_are_taken_at_their_register_width(fresh_probes, monkeypatch):
    monkeypatch.setattr(datapath, "_measure", lambda: pytest.fail("probed for another CPU"))
    other = dataclasses.replace(Target.host(), device="Some Other CPU 9000")
    assert not datapath.is_host_cpu(other)
    assert datapath.host_datapath_lanes(other) == other.vector_lanes_f32
    assert Machine.of(other).datapath == other.vector_lanes_f32
    assert not datapath.is_host_cpu(Target.cuda())


def test_the_cost_model_uses_the_measured_width_for_this_host(fresh_probes, monkeypatch):
    host = Target.host()
    monkeypatch.setattr(datapath, "_measure", lambda: {"datapath_lanes": 4, "rates": {}, "host": host.key})
    assert Machine.of(host).datapath == 4
    one_thread = dataclasses.replace(host, cores=1)  # the benchmark's target: this CPU, one thread
    assert datapath.is_host_cpu(one_thread) and Machine.of(one_thread).datapath == 4
