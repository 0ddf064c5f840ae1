"""What a model.skops file may name beyond skops's own trust: scikit-learn's types, never code that reads files,
fetches, or runs text, whatever path names it."""

from __future__ import annotations

import pytest

from workbench.platforms.sklearn_trust import is_trusted


@pytest.mark.parametrize(
    "name",
    [
        "sklearn.tree._tree.Tree",  # every tree ensemble
        "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
        "sklearn.gaussian_process.kernels.RBF",
        "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",
        "sklearn.feature_selection._univariate_selection.f_classif",  # SelectKBest's default score function
        "sklearn.neighbors._kd_tree.KDTree",
        "numpy.dtype",
        "numpy.mean",  # FeatureAgglomeration's pooling function
        "scipy.sparse._csr.csr_matrix",
        "scipy.interpolate._bsplines.BSpline",
        "scipy._lib.array_api_compat.numpy._aliases.asarray",
    ],
)
def test_what_fitted_scikit_learn_estimators_hold_is_trusted(name):
    assert is_trusted(name)


@pytest.mark.parametrize(
    "name",
    [
        "numpy.load",  # reads a file (numpy sets its __module__ to "numpy", as numpy.mean's)
        "numpy.fromfile",
        "numpy.memmap",
        "numpy.testing.runstring",  # exec
        "sklearn.datasets.fetch_openml",  # the network
        "sklearn.datasets._svmlight_format_io.dump_svmlight_file",  # writes files
        "sklearn.utils._testing.assert_run_python_script_without_output",  # runs a script
        "sklearn.utils.estimator_checks.check_estimator",
        "sklearn.tree.tests.test_tree.test_regression_toy",  # a package's own tests
        "sklearn.base.np.load",  # numpy.load, reached through scikit-learn's import of numpy
        "sklearn.utils.fixes.os.system",
        "scipy.sparse.np.memmap",
        "builtins.eval",
        "os.system",
        "tabular_models.Doubler",  # a user's own transformer
        "sklearn.nonexistent.Estimator",
    ],
)
def test_code_that_reads_writes_fetches_or_runs_text_is_not(name):
    assert not is_trusted(name)


def test_every_type_skops_trusts_itself_is_trusted():
    """A serving process imports skops without its table of trusted estimators (workbench.platforms.sklearn): its
    loads give skops every type it does not trust itself, checked here instead. That changes what loads only if a
    type of that table were refused here."""
    from skops.io import _trusted_types

    from workbench.platforms.sklearn import import_skops

    import_skops()
    table = _trusted_types.SKLEARN_ESTIMATOR_TYPE_NAMES + _trusted_types.SKLEARN_INTERNAL_TYPE_NAMES
    assert len(table) > 100, "skops's table is empty: this process was marked as serving"
    assert [name for name in table if not is_trusted(name)] == []
