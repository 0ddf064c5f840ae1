"""Drift statistics on synthetic distributions (PSI, Kolmogorov–Smirnov, chi-squared), the thresholds' syntax, and the
drift monitor's rolling window and references (exported, or the first rows served), fed as the serving path feeds it."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_until

from workbench.core.errors import Code, ServingError
from workbench.observability.drift import (
    CATEGORICAL,
    NUMERIC,
    Thresholds,
    compare,
    features,
    kind_of,
    numeric_psi,
    parse_thresholds,
)
from workbench.observability.drift_monitor import REFERENCE_FILE, DriftCollector, DriftMonitor
from workbench.observability.prediction_logs import PredictEntry


@pytest.fixture(autouse=True)
def rng() -> None:
    """Each test draws from its own seeded generator: the same samples whatever runs before it."""
    global RNG
    RNG = np.random.default_rng(7)


RNG = np.random.default_rng(7)


def test_same_distribution_has_low_psi_and_a_high_p_value():
    reference, window = RNG.normal(0, 1, 5000), RNG.normal(0, 1, 1000)
    result = compare("x", NUMERIC, reference, window, Thresholds())
    assert result.psi < 0.05 and result.p_value > 0.01 and result.test == "ks" and not result.drifted


def test_a_shifted_distribution_is_flagged_by_psi_and_ks():
    reference, window = RNG.normal(0, 1, 5000), RNG.normal(1.0, 1, 1000)
    result = compare("x", NUMERIC, reference, window, Thresholds())
    assert result.psi > 0.5 and result.p_value < 1e-10 and result.statistic > 0.3 and result.drifted


def test_a_wider_spread_with_the_same_mean_is_flagged():
    reference, window = RNG.normal(0, 1, 5000), RNG.normal(0, 3, 1000)
    assert compare("x", NUMERIC, reference, window, Thresholds()).drifted


def test_categories_use_chi_squared_and_psi():
    reference = RNG.choice(np.array(["a", "b", "c"], object), 3000, p=[0.5, 0.3, 0.2])
    same = RNG.choice(np.array(["a", "b", "c"], object), 1000, p=[0.5, 0.3, 0.2])
    moved = RNG.choice(np.array(["a", "b", "c"], object), 1000, p=[0.2, 0.3, 0.5])
    steady = compare("c", CATEGORICAL, reference, same, Thresholds())
    shifted = compare("c", CATEGORICAL, reference, moved, Thresholds())
    assert steady.test == "chi2" and steady.p_value > 0.01 and steady.psi < 0.05 and not steady.drifted
    assert shifted.p_value < 1e-10 and shifted.psi > 0.25 and shifted.drifted


def test_a_category_never_seen_in_the_reference_counts_as_drift():
    reference = np.array([b"a", b"b"] * 500, object)
    window = np.array([b"a", b"b", b"new"] * 300, object)
    assert compare("c", CATEGORICAL, reference, window, Thresholds()).drifted


def test_kinds_and_features():
    assert kind_of(np.array([1.5, 2.5])) == NUMERIC
    assert kind_of(np.arange(1000)) == NUMERIC
    assert kind_of(np.array([0, 1, 2] * 10)) == CATEGORICAL  # few whole numbers: categories
    assert kind_of(np.array(["a"], object)) == CATEGORICAL and kind_of(np.array([True])) == CATEGORICAL
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = features({"x": x, "s": np.array([b"a", b"b", b"c"]), "img": np.zeros((3, 4, 4)), "wide": np.zeros((3, 65))})
    assert sorted(got) == ["s", "x[0]", "x[1]"] and list(got["x[1]"]) == [1.0, 3.0, 5.0]


def test_psi_of_identical_samples_is_zero():
    values = RNG.normal(0, 1, 1000)
    assert numeric_psi(values, values) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("psi=0.2,p_value=0.001", Thresholds(0.2, 0.001)),
        ("psi=0.25", Thresholds(0.25, None)),
        (" p_value = 0.01 ", Thresholds(None, 0.01)),
    ],
)
def test_thresholds_parse(text, expected):
    assert parse_thresholds(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("psi", "'psi' is not psi=NUMBER or p_value=NUMBER"),
        ("ks=0.1", "'ks=0.1' is not psi=NUMBER or p_value=NUMBER"),
        ("psi=high", "psi='high' is not a number"),
        ("p_value=1.5", "p_value must be from 0 to 1 (exclusive), got 1.5"),
        ("psi=-1", "psi must be above 0, got -1"),
        ("", "names no threshold"),
    ],
)
def test_bad_thresholds_are_refused_by_name(text, message):
    with pytest.raises(ServingError) as info:
        parse_thresholds(text)
    assert info.value.code == Code.INVALID_ARGUMENT and message in info.value.message


def test_bad_window_sizes_are_refused():
    with pytest.raises(ServingError, match="--drift_window must be at least 1 row, got 0"):
        DriftMonitor(window_rows=0)
    with pytest.raises(ServingError, match="--drift_reference_rows must be 0 or more, got -1"):
        DriftMonitor(reference_rows=-1)


# ------------------------------------------------------------------------------------------------ the monitor
def servable(path: Path, version: int = 1) -> types.SimpleNamespace:
    """What the monitor reads of a servable: its name, version and folder."""
    return types.SimpleNamespace(name="m", version=version, path=str(path))


def serve_rows(monitor: DriftMonitor, target: types.SimpleNamespace, x: np.ndarray, batch: int = 50) -> None:
    for start in range(0, len(x), batch):
        rows = x[start : start + batch]
        monitor.offer(target, lambda r=rows: PredictEntry("m", target.version, "serving_default", {"x": r}, (), {}))


def report(monitor: DriftMonitor, rows: int) -> dict:
    """The monitor's report once it has tested ``rows`` served rows."""
    return wait_until(
        lambda: (r := monitor.report("m")) and r[0]["rows_tested"] == rows and r[0], what=f"{rows} rows tested"
    )


def shifted(n: int) -> np.ndarray:
    x = RNG.normal(0, 1, (n, 3))
    x[:, 1] += 2.0  # only feature 1 moves
    return x


def test_an_exported_reference_flags_only_the_shifted_feature(tmp_path, caplog):
    version = tmp_path / "1"
    (version / REFERENCE_FILE).parent.mkdir(parents=True)
    np.savez(version / REFERENCE_FILE, **{"*": RNG.normal(0, 1, (2000, 3))})  # the only input, whatever its name
    monitor = DriftMonitor(window_rows=300, min_rows=300)
    target = servable(version)
    serve_rows(monitor, target, RNG.normal(0, 1, (300, 3)))
    steady = report(monitor, 300)
    assert steady["reference"] == {"source": "export", "rows": 2000} and not steady["alert"], steady
    assert [f["name"] for f in steady["features"]] == ["x[0]", "x[1]", "x[2]"]
    tested_when_said: list[int] = []  # what the report showed as the alert was logged

    class Reading(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "drifted from its reference" in record.getMessage():
                tested_when_said.append(monitor.report("m")[0]["rows_tested"])

    reading = Reading()
    logging.getLogger("workbench.observability.drift_monitor").addHandler(reading)
    try:
        with caplog.at_level(logging.WARNING, logger="workbench.observability.drift_monitor"):
            serve_rows(monitor, target, shifted(300))
            drifted = wait_until(lambda: (r := monitor.report("m")[0])["rows_tested"] == 600 and r, what="all tested")
    finally:
        logging.getLogger("workbench.observability.drift_monitor").removeHandler(reading)
    assert drifted["drifted_features"] == ["x[1]"], drifted
    alerts = [r.getMessage() for r in caplog.records if "drifted from its reference" in r.getMessage()]
    assert len(alerts) == 1 and "feature x[1]" in alerts[0]  # said once, on crossing
    assert tested_when_said == [300]  # said before the report showed it: a reader of the alert finds the line
    samples = {
        (s.name, s.labels.get("feature"), s.labels.get("test")): s.value
        for family in DriftCollector(monitor).collect()
        for s in family.samples
    }
    assert samples[("workbench_drift_alert", "x[1]", None)] == 1.0
    assert samples[("workbench_drift_alert", "x[0]", None)] == 0.0
    assert samples[("workbench_drift_p_value", "x[1]", "ks")] < 0.001
    monitor.close()


def test_the_first_rows_served_are_the_reference_without_an_export(tmp_path):
    monitor = DriftMonitor(window_rows=200, reference_rows=400, min_rows=200)
    target = servable(tmp_path / "1")
    serve_rows(monitor, target, RNG.normal(0, 1, (400, 3)))
    serve_rows(monitor, target, shifted(200))
    drifted = wait_until(lambda: (r := monitor.report("m")) and r[0]["rows_tested"] == 200 and r[0], what="all tested")
    assert drifted["reference"] == {"source": "requests", "rows": 400}
    assert drifted["drifted_features"] == ["x[1]"] and drifted["window_rows"] == 200


def test_a_version_without_a_reference_is_not_monitored(tmp_path):
    monitor = DriftMonitor(window_rows=10)
    target = servable(tmp_path / "1")
    serve_rows(monitor, target, np.zeros((20, 2)), batch=10)
    wait_until(lambda: monitor._monitored.get(("m", 1)) is False, what="the version looked at")
    assert monitor.report("m") == []
    monitor.close()


def test_psi_sees_a_window_moving_off_a_value_the_reference_holds_at_most_deciles():
    """A pixel nearly always 0 (or a reading clipped at its maximum): its deciles are all that value. A window off it
    drifts (it used to share one bin with the reference's every value: PSI 0)."""
    rng = np.random.default_rng(0)
    mostly_zero = np.where(rng.random(2000) < 0.95, 0.0, rng.random(2000) * 16)
    scratched = np.full(500, 8.0)
    assert numeric_psi(mostly_zero, scratched) > 1.0
    assert numeric_psi(mostly_zero, mostly_zero[:500]) < 0.05
    clipped = np.minimum(rng.normal(15, 3, 2000), 10.0)  # most of it at the maximum, 10
    assert numeric_psi(clipped, np.full(500, 9.0)) > 1.0
    assert numeric_psi(clipped, clipped[:500]) < 0.05


def test_whole_numbers_in_a_float_matrix_are_categories_and_fractions_are_numbers():
    assert kind_of(np.array([0.0, 1.0, 16.0, 3.0])) == CATEGORICAL  # an image's grey levels, fed as floats
    assert kind_of(np.arange(30, dtype=np.float64)) == NUMERIC  # more than 20 values
    assert kind_of(np.array([0.5, 1.0, 2.0])) == NUMERIC
    assert kind_of(np.array([1, 2, 3])) == CATEGORICAL
