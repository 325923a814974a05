"""Cost models: GBDT learns a ranking that transfers to held-out workloads; safe save/load round trips;
no pickle anywhere; retraining from a database caches features by version."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.target import Target
from cost_model.dataset import load_dataset
from cost_model.evaluate import cross_validate, spearman, top_k_score, train_and_score
from cost_model.features import EST_INDEX, FEATURE_NAMES, FEATURE_VERSION, N_FEATURES
from cost_model.gbdt import GBDTModel
from cost_model.model import AnalyticModel, RandomModel, create_model, load_model, normalized_labels
from db.database import RecordIn, TuningDatabase
from db.status import Status
from tuner.task import extract_tasks

ROOT = Path(__file__).resolve().parents[2]
CPU = Target.host()


def synthetic(n_workloads: int = 6, per: int = 80, seed: int = 0):
    """Random features; latency depends on three candidate columns the same way in every workload (times
    a workload scale), so a model must learn the shape to rank held-out workloads. Each workload has its
    own ``wl_*`` values (pointwise, the same on all its rows, as real workloads do). The analytic estimate
    column is constant (no prior)."""
    rng = np.random.default_rng(seed)
    wl_cols = [i for i, n in enumerate(FEATURE_NAMES) if n.startswith("wl_")]
    kind_cols = [
        FEATURE_NAMES.index(f"wl_kind_{k}") for k in ("pointwise", "reduction", "contraction", "other")
    ]
    a, b, c = (FEATURE_NAMES.index(n) for n in ("tot_log_bytes", "wm_vec_eff", "s0_log_unroll"))
    xs, lats, wls = [], [], []
    for w in range(n_workloads):
        x = rng.normal(size=(per, N_FEATURES)).astype(np.float32)
        x[:, wl_cols] = rng.normal(size=len(wl_cols))
        x[:, kind_cols] = (1.0, 0.0, 0.0, 0.0)
        x[:, EST_INDEX] = 20.0  # an uninformative analytic prior
        speed = 2.0 * x[:, a] - np.abs(x[:, b]) + 0.5 * (x[:, c] > 0)
        lat = (10.0 ** (w % 3 + 1)) * np.exp(-0.5 * speed)
        lat[rng.random(per) < 0.05] = np.nan  # failed candidates
        xs.append(x)
        lats.append(lat)
        wls += [f"w{w}"] * per
    return np.concatenate(xs), np.concatenate(lats), wls


def test_normalized_labels_per_workload():
    y = normalized_labels(np.array([2.0, 4.0, np.nan, 10.0, 5.0]), np.array(["a", "a", "a", "b", "b"]))
    np.testing.assert_allclose(y, [1.0, 0.5, 0.0, 0.5, 1.0])


@pytest.mark.parametrize("target", ["rank", "residual", "ratio"])
def test_gbdt_learns_a_ranking_that_transfers(target):
    """Leave each workload out in turn: the model trained on the others ranks it (means over the folds; a
    single fold's top-1 on 80 random candidates is too noisy to assert)."""
    x, lat, wl = synthetic()
    rho, top1, top5, rand1 = [], [], [], []
    for held in sorted(set(wl)):
        train = np.asarray(wl) != held
        model = GBDTModel(seed=0, target=target, center=target == "rank")
        model.update(x[train], lat[train], [w for w, t in zip(wl, train) if t])
        assert model.fits >= 1 and model.forest is not None
        scores = model.predict(x[~train])
        rho.append(spearman(scores, lat[~train]))
        top1.append(top_k_score(scores, lat[~train], 1))
        top5.append(top_k_score(scores, lat[~train], 5))
        rand1.append(top_k_score(RandomModel(1).predict(x[~train]), lat[~train], 1))
        assert abs(spearman(RandomModel(1).predict(x[~train]), lat[~train])) < 0.4
    # LambdaMART optimizes the top of the order (NDCG), regressions the whole order
    assert np.mean(rho) > (0.4 if target == "rank" else 0.8)
    assert np.mean(top5) > 0.75
    assert np.mean(top1) > np.mean(rand1) + 0.3


def test_gbdt_refits_adaptively_and_blends_with_the_prior_while_data_is_scarce():
    x, lat, wl = synthetic(1, 60)
    model = GBDTModel(seed=0, min_fit=8, refit_every=8, trust_samples=48, target="ratio")
    x[:, EST_INDEX] = np.arange(len(x))
    assert np.array_equal(model.predict(x[:5]), -x[:5, EST_INDEX].astype(np.float64))  # cold: analytic
    model.update(x[:4], lat[:4], wl[:4])
    assert model.fits == 0
    model.update(x[4:12], lat[4:12], wl[4:12])
    assert model.fits == 1
    blended = model.predict(x[12:20])
    assert blended.min() >= 0.0 and blended.max() <= 1.0  # rank blend with the prior
    model.update(x[12:16], lat[12:16], wl[12:16])
    assert model.fits == 1  # fewer than refit_every new samples
    model.update(x[16:60], lat[16:60], wl[16:60])
    assert model.fits == 2 and model.n_fit == 60


def test_inline_below_fits_small_data_at_once_even_when_asked_to_wait(tmp_path):
    x, lat, wl = synthetic(1, 40)
    waits = GBDTModel(seed=0, inline_below=0)
    waits.update(x[:8], lat[:8], wl[:8], fit=False)
    assert waits.fits == 0 and waits.fit_if_due() and waits.fits == 1
    model = GBDTModel(seed=0, inline_below=16)
    model.update(x[:8], lat[:8], wl[:8], fit=False)
    assert model.fits == 1 and model.n_fit == 8  # small: fitted in line
    model.update(x[8:16], lat[8:16], wl[8:16], fit=False)
    assert model.fits == 2 and model.n_fit == 16
    model.update(x[16:24], lat[16:24], wl[16:24], fit=False)
    assert model.fits == 2  # beyond inline_below: waits for fit_if_due as before
    assert model.fit_if_due() and model.n_fit == 24
    assert load_model(model.save(tmp_path / "m.npz")).inline_below == 16


def test_residual_target_starts_from_the_analytic_prior_and_corrects_it():
    from cost_model.gbdt import residual_labels

    x, lat, wl = synthetic(2, 60)
    x[:, EST_INDEX] = np.log2(np.where(np.isfinite(lat), lat, 1.0))  # a perfect prior
    r = residual_labels(x, lat, np.asarray(wl))
    assert np.allclose(r[np.isfinite(lat)], 0.0, atol=1e-5) and np.allclose(
        r[~np.isfinite(lat)], 1.0, atol=1e-5
    )
    model = GBDTModel(seed=0, target="residual")
    np.testing.assert_array_equal(model.predict(x), -x[:, EST_INDEX].astype(np.float64))
    x[:, EST_INDEX] = 0.0  # a useless prior: the trees must learn the whole ranking
    model.update(x[:60], lat[:60], wl[:60])
    assert spearman(model.predict(x[60:]), lat[60:]) > 0.7


def test_residual_correction_is_weighted_by_same_kind_data():
    from cost_model.gbdt import KIND_COLUMNS

    x, lat, wl = synthetic(2, 60)
    x[:, KIND_COLUMNS] = 0.0
    x[:, KIND_COLUMNS[2]] = 1.0  # every training row is a contraction
    model = GBDTModel(seed=0, prior_samples=16.0)
    model.update(x, lat, wl)
    other = x[:10].copy()
    other[:, KIND_COLUMNS[2]] = 0.0
    other[:, KIND_COLUMNS[0]] = 1.0  # pointwise rows: no data of their kind, the prior alone
    np.testing.assert_array_equal(model.predict(other), -other[:, EST_INDEX].astype(np.float64))
    # 120 contraction samples; the row's workload has 60 of them and one other workload taught the rest
    assert model.correction_weight(x[:1])[0] == pytest.approx(120 / 136 * (1 / 33 + 32 / 33 * 60 / 92))
    assert not np.array_equal(model.predict(x[:10]), -x[:10, EST_INDEX].astype(np.float64))


def test_rank_target_boosts_from_the_analytic_prior():
    from cost_model.gbdt import rank_grades

    g = rank_grades(np.array([2.0, 4.0, np.nan, 2.0 * 2**0.25, 10.0]), np.array(["a", "a", "a", "a", "b"]))
    np.testing.assert_array_equal(g, [15, 11, 0, 14, 15])  # 4 grades per 2x slower, failures 0
    x, lat, wl = synthetic(3, 60)
    x[:, EST_INDEX] = np.log2(np.where(np.isfinite(lat), lat, 1e4))  # a perfect prior
    model = GBDTModel(seed=0)  # the default: LambdaMART from the prior
    np.testing.assert_array_equal(model.predict(x), -x[:, EST_INDEX].astype(np.float64))
    model.update(x[:120], lat[:120], wl[:120])
    assert model.fits == 1 and spearman(model.predict(x[120:]), lat[120:]) > 0.95  # the prior kept
    # a useless prior: the trees must learn the order of an unseen workload. LambdaMART's grades stop 15
    # steps of 2^(1/4) below a workload's best, so it learns the top of the order (top-k), not all of it;
    # one small draw is noisy, so four draws against random scores
    from cost_model.evaluate import top_k_score

    learned, chance = [], []
    for seed in range(4):
        x, lat, wl = synthetic(3, 60, seed=seed)
        x[:, EST_INDEX] = 0.0
        model = GBDTModel(seed=0)
        model.update(x[:120], lat[:120], wl[:120])
        learned.append(top_k_score(model.predict(x[120:]), lat[120:], 5))
        chance.append(top_k_score(np.random.default_rng(seed).random(60), lat[120:], 5))
    assert np.mean(learned) > np.mean(chance) + 0.3


def test_forest_matches_lightgbm():
    import lightgbm as lgb

    from cost_model.gbdt import Forest

    x, lat, wl = synthetic(2, 100)
    x[::7, 3] = np.nan  # missing values follow LightGBM's default direction
    y = normalized_labels(lat, np.asarray(wl))
    params = {"objective": "regression", "num_leaves": 7, "verbose": -1, "num_threads": 1}
    booster = lgb.train(params, lgb.Dataset(x.astype(np.float64), y), num_boost_round=20)
    np.testing.assert_allclose(
        Forest.from_lightgbm(booster).predict(x), booster.predict(x.astype(np.float64)), rtol=1e-9, atol=1e-9
    )


def test_forest_matches_scikit_learn():
    from sklearn.ensemble import HistGradientBoostingRegressor

    from cost_model.gbdt import Forest

    x, lat, wl = synthetic(2, 100)
    y = normalized_labels(lat, np.asarray(wl))
    est = HistGradientBoostingRegressor(max_iter=30, early_stopping=False).fit(x.astype(np.float64), y)
    np.testing.assert_allclose(Forest.from_sklearn(est).predict(x), est.predict(x.astype(np.float64)))


@pytest.mark.parametrize("name", ["gbdt", "analytic", "random"])
def test_save_load_round_trip(tmp_path, name):
    x, lat, wl = synthetic(3, 50)
    model = create_model(name, seed=3)
    model.update(x, lat, wl)
    path = model.save(tmp_path / f"{name}.npz")
    loaded = load_model(path)
    assert type(loaded) is type(model) and loaded.n_updates == model.n_updates
    if name == "random":
        np.testing.assert_array_equal(loaded.predict(x), create_model("random", seed=3).predict(x))
    else:
        np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    if name == "gbdt":  # the loaded model keeps its data and keeps learning
        loaded.update(x[:10], lat[:10], wl[:10])
        assert loaded.n_samples == len(lat) + 10
        with np.load(path, allow_pickle=False) as data:  # plain arrays only
            assert all(not data[k].dtype.hasobject for k in data.files)


def test_load_rejects_foreign_files(tmp_path):
    bad = tmp_path / "x.npz"
    np.savez(bad, a=np.zeros(3))
    with pytest.raises(KilnError, match="not a Kiln cost model"):
        load_model(bad)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(KilnError, match="cannot read"):
        load_model(tmp_path / "junk.npz")
    model = AnalyticModel()
    path = model.save(tmp_path / "old.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    import json

    meta = json.loads(arrays["meta"].tobytes())
    meta["feature_version"] = FEATURE_VERSION + 1
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", **arrays)
    with pytest.raises(KilnError, match="retrain"):
        load_model(tmp_path / "old.npz")


def test_no_pickle_in_the_package():
    banned = re.compile(
        r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|joblib|shelve|marshal)\b", re.M
    )
    files = [*sorted((ROOT / "cost_model").rglob("*.py")), ROOT / "tuner" / "cost_filter.py"]
    files.append(ROOT / "tuner" / "commands" / "cost_model.py")
    for path in files:
        text = path.read_text()
        assert not banned.search(text), f"{path} imports a pickle-based serializer"
        assert "allow_pickle=True" not in text, path
        assert "pickle.load" not in text, path


def _tasks():
    out = []
    for rows, cols in ((32, 128), (64, 256), (16, 512)):
        b = GraphBuilder(f"sm{rows}")
        (task,) = extract_tasks(b.build([b.softmax(b.input("x", (rows, cols)))]), CPU)
        out.append(task)
    return out


def _fake_latency(config) -> float:
    v = {1: 8.0, 4: 4.0, 8: 2.5, 16: 2.0}[config["vector"]]
    return 10.0 + v * 4 / (1 + config["accum"]) + (0 if config["parallel"] == "rows" else 1.5)


def _configs(task, n=24):
    import itertools

    out = []
    for vals in itertools.product(*(k.values for k in task.space())):
        c = dict(zip((k.name for k in task.space()), vals))
        try:
            task.check(c)
        except Exception:
            continue
        out.append(c)
    return out[:: max(1, len(out) // n)][:n]


def make_db(url: str) -> TuningDatabase:
    """A small database: three softmax workloads, records with synthetic latencies (and one error)."""
    db = TuningDatabase.open(url)
    db.commit_target(CPU.key, CPU.to_json())
    for task in _tasks():
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        recs = [
            RecordIn(task.workload_key, CPU.key, "reduction", task.sketch.version, c,
                     [_fake_latency(c) * task.flops / 1e4] * 3, Status.OK)
            for c in _configs(task)
        ]  # fmt: skip
        recs.append(
            RecordIn(
                task.workload_key,
                CPU.key,
                "reduction",
                task.sketch.version,
                recs[0].config,
                None,
                "runtime_error",
            )
        )
        db.commit_records(recs)
    return db


def test_retrain_from_database_with_cached_features(tmp_path):
    db = make_db(f"sqlite:///{tmp_path / 'k.db'}")
    first = load_dataset(db, CPU.key)
    assert len(first) == first.computed == 3 * 24 + 3
    assert np.isnan(first.latencies).sum() == 3  # errors are kept as failed candidates
    assert len(db.features(FEATURE_VERSION)) == len(first)
    again = load_dataset(db, CPU.key)
    assert again.computed == 0  # read back from the database
    np.testing.assert_array_equal(again.x, first.x)
    result = cross_validate(again, lambda: GBDTModel(seed=0), "gbdt")
    assert len(result.rows) == 3
    assert result.mean("spearman") > 0.5 and result.mean("top5") >= 0.9


def test_reported_registers_reach_the_features_and_bypass_the_feature_cache(tmp_path):
    """``load_dataset(registers=...)``: the build's count per record goes into ``gpu_regs`` (with
    ``gpu_regs_reported``), and such vectors are neither read from nor written to the cache, whose vectors
    hold estimated counts."""
    cuda = Target.cuda()
    b = GraphBuilder("relu")
    task = extract_tasks(b.build([b.relu(b.input("x", (256, 1024)))]), cuda)[0]
    db = TuningDatabase.open(f"sqlite:///{tmp_path / 'c.db'}")
    db.commit_target(cuda.key, cuda.to_json())
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    db.commit_records([RecordIn(task.workload_key, cuda.key, task.sketch.name, task.sketch.version,
                                task.default(), [5.0, 5.0], Status.OK)])  # fmt: skip
    estimated = load_dataset(db, cuda.key)
    assert len(db.features(FEATURE_VERSION)) == 1
    reported = load_dataset(db, cuda.key, registers=lambda record: 200)
    regs, flag = FEATURE_NAMES.index("gpu_regs"), FEATURE_NAMES.index("gpu_regs_reported")
    assert reported.computed == 1 and reported.x[0, regs] == 200 and reported.x[0, flag] == 1
    assert estimated.x[0, flag] == 0 and estimated.x[0, regs] != 200
    np.testing.assert_array_equal(load_dataset(db, cuda.key).x, estimated.x)  # the cache kept the estimate


def test_train_and_score_trains_on_one_set_and_scores_each_pool_of_the_other(tmp_path):
    data = load_dataset(make_db(f"sqlite:///{tmp_path / 'k.db'}"), CPU.key)
    keys = sorted(set(data.workloads))
    train, test = data.only(keys[:2]), data.only(keys[2:])
    result = train_and_score(train, test, lambda: GBDTModel(seed=0), "gbdt")
    assert [r.workload for r in result.rows] == keys[2:] and set(result.predictions) == set(keys[2:])
    row = result.rows[0]
    assert row.n == int(np.isfinite(test.latencies).sum()) and 0 < row.top1 <= row.top5 <= 1.0
    # the same scores as the fold of leave-one-workload-out that holds that workload out
    loo = {r.workload: r for r in cross_validate(data, lambda: GBDTModel(seed=0), "gbdt").rows}
    assert (loo[keys[2]].top1, loo[keys[2]].top5) == (row.top1, row.top5)


def test_prior_trust_is_learned_per_workload_from_its_measurements(tmp_path):
    from cost_model.gbdt import WORKLOAD_COLUMNS, signatures

    x, lat, wl = synthetic(2, 48)
    x[:48, WORKLOAD_COLUMNS], x[48:, WORKLOAD_COLUMNS] = 0.0, 1.0  # two workloads, one signature each
    log_lat = np.log2(np.where(np.isfinite(lat), lat, 1.0))
    x[:48, EST_INDEX] = log_lat[:48]  # workload 0: the prior is right
    x[48:, EST_INDEX] = -log_lat[48:]  # workload 1: the prior has the order backwards
    # own_samples=0: the correction of a workload with its own samples is not discounted for being learned
    # next to another workload's (that discount has its own test below)
    model = GBDTModel(seed=0, prior_trust=4.0, own_samples=0.0)
    train = np.r_[0:32, 48:80]
    model.update(x[train], lat[train], [wl[i] for i in train])
    right, wrong = (model.trust[signatures(x[i : i + 1])[0]] for i in (0, 48))
    assert right > 0.95 and wrong == pytest.approx(4 / (4 + np.isfinite(lat[48:80]).sum()))
    test = slice(80, 96)
    assert spearman(model.predict(x[test]), lat[test]) > spearman(-x[test, EST_INDEX], lat[test]) + 0.5
    same = load_model(model.save(tmp_path / "m.npz"))
    np.testing.assert_array_equal(same.predict(x), model.predict(x))
    unseen = x[:4].copy()
    unseen[:, WORKLOAD_COLUMNS] = 2.0  # a workload with no measurements keeps the prior at full weight
    learned = model.forest.predict(unseen)  # the default ranks on the plain features (center=False)
    expected = -unseen[:, EST_INDEX] + model.correction_weight(unseen) * learned
    np.testing.assert_allclose(model.predict(unseen), expected)


def _with_workload_columns(x: np.ndarray, wl: list[str], kind: int) -> np.ndarray:
    """``x`` with the ``wl_*`` columns made one workload summary per workload name, all of one kind."""
    from cost_model.gbdt import KIND_COLUMNS, WORKLOAD_COLUMNS

    x = x.copy()
    names = sorted(set(wl))
    for i, name in enumerate(names):
        rows = np.asarray(wl) == name
        x[np.ix_(rows, WORKLOAD_COLUMNS)] = float(i + 1)
        x[np.ix_(rows, KIND_COLUMNS)] = 0.0
        x[rows, KIND_COLUMNS[kind]] = 1.0
    return x


def test_transfer_to_an_unseen_workload_is_weighted_by_same_kind_workloads(tmp_path):
    x, lat, wl = synthetic(3, 40)
    x = _with_workload_columns(x, wl, kind=2)
    train = np.asarray(wl) != "w2"
    model = GBDTModel(seed=0)
    model.update(x[train], lat[train], list(np.asarray(wl)[train]))
    seen, unseen = x[:5], x[~train][:5]
    samples = 80 / (80 + model.prior_samples)  # two trained workloads of 40 samples, all contractions
    # a trained workload: one other workload taught the rest, its own 40 samples fade that discount
    np.testing.assert_allclose(model.correction_weight(seen), samples * (1 / 33 + 32 / 33 * 40 / 72))
    np.testing.assert_allclose(model.correction_weight(unseen), samples * 2 / (2 + 32))
    off = GBDTModel(seed=0, transfer_workloads=0.0)
    off.update(x[train], lat[train], list(np.asarray(wl)[train]))
    np.testing.assert_allclose(off.correction_weight(unseen), samples)
    np.testing.assert_allclose(off.correction_weight(seen), samples)
    no_fade = GBDTModel(seed=0, own_samples=0.0)  # before stop 36: full weight from the first own sample
    no_fade.update(x[train], lat[train], list(np.asarray(wl)[train]))
    np.testing.assert_allclose(no_fade.correction_weight(seen), samples)
    np.testing.assert_allclose(no_fade.correction_weight(unseen), samples * 2 / (2 + 32))
    # the trees are the same: only the weight of their correction differs
    np.testing.assert_allclose(model.forest.predict(x), off.forest.predict(x))
    prior = -unseen[:, EST_INDEX].astype(np.float64)
    np.testing.assert_allclose(model.predict(unseen) - prior, (off.predict(unseen) - prior) * 2 / 34)
    again = load_model(model.save(tmp_path / "m.npz"))
    np.testing.assert_allclose(again.predict(unseen), model.predict(unseen))
    assert again.transfer_workloads == 32.0 and again.fit_workloads == model.fit_workloads
    np.testing.assert_allclose(again.correction_weight(seen), model.correction_weight(seen))
    with pytest.raises(ValueError, match="transfer_workloads"):
        GBDTModel(transfer_workloads=-1.0)
    with pytest.raises(ValueError, match="own_samples"):
        GBDTModel(own_samples=-1.0)


def test_transfer_discount_fades_with_the_workloads_own_samples():
    x, lat, wl = synthetic(3, 40)
    x = _with_workload_columns(x, wl, kind=2)
    names = np.asarray(wl)
    others = names != "w2"
    new = np.flatnonzero(~others)
    weights = []
    for k in (0, 8, 24, 40):  # the new workload's own samples in the training data
        rows = np.flatnonzero(others)
        rows = np.concatenate([rows, new[:k]])
        model = GBDTModel(seed=0)
        model.update(x[rows], lat[rows], list(names[rows]))
        n = len(rows) / (len(rows) + 32)
        t = 2 / (2 + 32)  # the two other contractions
        expected = n * (t + (1 - t) * k / (k + 32))
        weights.append(model.correction_weight(x[new[:1]])[0])
        assert weights[-1] == pytest.approx(expected)
    assert weights == sorted(weights) and weights[0] < 0.1 and weights[-1] > 0.4
    cold = GBDTModel(seed=0)  # a cold search: its own workload only, nothing to discount
    cold.update(x[new[:24]], lat[new[:24]], list(names[new[:24]]))
    assert cold.correction_weight(x[new[:1]])[0] == pytest.approx(24 / (24 + 32))


def test_tree_sizes_default_by_target():
    assert GBDTModel().params["max_iter"] == 40 and GBDTModel().params["max_leaf_nodes"] == 7
    residual = GBDTModel(target="residual")
    assert residual.params["max_iter"] == 150 and residual.params["max_leaf_nodes"] == 15
    assert GBDTModel(max_iter=7, max_leaf_nodes=3).params == {
        "max_iter": 7,
        "learning_rate": 0.1,
        "max_leaf_nodes": 3,
    }


def test_a_cold_model_fits_its_first_rounds_in_line():
    # kiln tune's default: the first rounds of a cold search are ranked with what the previous round measured
    x, lat, wl = synthetic(1, 80)
    model = GBDTModel(seed=0)
    model.update(x[:8], lat[:8], wl[:8], fit=False)
    assert model.fits == 1 and model.n_fit == 8
    model.update(x[8:72], lat[8:72], wl[8:72], fit=False)
    assert model.fits == 1  # 72 samples: no longer small, the search refits in the background


def _two_kinds(per_kind: int = 12, per: int = 40, seed: int = 0):
    """Pointwise workloads that all share one lesson the prior misses, and reduction workloads whose prior
    misses only a little of a column of their own (nothing to transfer)."""
    from cost_model.gbdt import KIND_COLUMNS, WORKLOAD_COLUMNS

    rng = np.random.default_rng(seed)
    a, b = (FEATURE_NAMES.index(n) for n in ("tot_log_bytes", "wm_vec_eff"))
    own = [i for i, n in enumerate(FEATURE_NAMES) if not n.startswith("wl_") and i not in (a, b, EST_INDEX)]
    xs, lats, wls = [], [], []
    for kind in (0, 1):
        for w in range(per_kind):
            x = rng.normal(size=(per, N_FEATURES)).astype(np.float32)
            x[:, WORKLOAD_COLUMNS] = rng.normal(size=len(WORKLOAD_COLUMNS))
            x[:, KIND_COLUMNS] = 0.0
            x[:, KIND_COLUMNS[kind]] = 1.0
            # kind 1: a little of a column of its own per workload, which no other workload can teach
            truth = x[:, b] + (2.0 * x[:, a] if kind == 0 else 0.3 * x[:, own[w]])
            x[:, EST_INDEX] = -x[:, b]  # the prior knows b only
            lats.append(np.exp(-truth))
            xs.append(x)
            wls += [f"k{kind}w{w}"] * per
    return np.concatenate(xs), np.concatenate(lats), wls


def test_transfer_scale_is_learned_per_kind_by_validation_on_the_training_workloads(tmp_path):
    from cost_model.gbdt import KIND_COLUMNS, MIN_VALIDATED, WORKLOAD_COLUMNS

    x, lat, wl = _two_kinds()
    model = GBDTModel(seed=0)
    model.update(x, lat, wl)
    # the shared lesson is worth more than the default transfer weight; the workloads' own ones nothing
    assert model.transfer_scale[0] > 1.0 and model.transfer_scale[1] == 0.0
    assert list(model.transfer_scale[2:]) == [1.0] * (len(KIND_COLUMNS) - 2)  # no data: not validated
    unseen_reduction = x[np.asarray(wl) == "k1w0"][:5].copy()
    unseen_reduction[:, WORKLOAD_COLUMNS[~np.isin(WORKLOAD_COLUMNS, KIND_COLUMNS)]] = 9.0  # a new workload
    np.testing.assert_array_equal(model.correction_weight(unseen_reduction), 0.0)  # the prior alone
    # validated again only when the training workloads change, not at every refit
    validated = model._validated_on
    model.update(x[:8], lat[:8], wl[:8])
    assert model.fits == 2 and model._validated_on is validated
    again = load_model(model.save(tmp_path / "m.npz"))
    np.testing.assert_array_equal(again.transfer_scale, model.transfer_scale)
    np.testing.assert_allclose(again.predict(unseen_reduction), model.predict(unseen_reduction))
    off = GBDTModel(seed=0, transfer_folds=0)
    off.update(x, lat, wl)
    assert list(off.transfer_scale) == [1.0] * len(KIND_COLUMNS)
    few = GBDTModel(seed=0)  # fewer than MIN_VALIDATED workloads of each kind: not validated
    rows = np.isin(wl, [f"k{k}w{w}" for k in (0, 1) for w in range(MIN_VALIDATED - 1)])
    few.update(x[rows], lat[rows], list(np.asarray(wl)[rows]))
    assert list(few.transfer_scale) == [1.0] * len(KIND_COLUMNS)
    with pytest.raises(ValueError, match="transfer_folds"):
        GBDTModel(transfer_folds=1)
