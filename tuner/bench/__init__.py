"""Regression benchmarks: what `kiln bench` runs, stores and compares.

Modules, one job each:

* :mod:`~tuner.bench.suite`: built-in suites (quick, zoo, onnx DIR) and TOML suite files;
* :mod:`~tuner.bench.contenders`: the :class:`~tuner.bench.contenders.Contender` ABC, Kiln and its peers,
  and an in-memory contender for tests (:mod:`~tuner.bench.torch_peer`: a graph as torch ops);
* :mod:`~tuner.bench.timing`: interleaved rounds in rotated order, clocks, the slowdown test hook;
* :mod:`~tuner.bench.runner`: check every contender against the reference, then time them together;
* :mod:`~tuner.bench.ceilings`: copy bandwidth at matching working sets and SGEMM, with the same threads;
* :mod:`~tuner.bench.environment`: the environment fingerprint stored with a run;
* :mod:`~tuner.bench.results`: runs and results as data, JSON and CSV export;
* :mod:`~tuner.bench.storage`: runs in the tuning database (tables of migration 0004_bench);
* :mod:`~tuner.bench.stats` and :mod:`~tuner.bench.compare`: summaries and the regression verdict;
* :mod:`~tuner.bench.report`: markdown and matplotlib charts.
"""
