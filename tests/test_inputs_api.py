"""Issue 26, the Python API: None and wrong types are one InputError naming the argument (not an
AttributeError or TypeError from deep inside), numpy integers are integers, and the API refuses what the
command line refuses (the same bounds of tpsim/limits.py)."""

import numpy as np
import pytest

import tpsim
from tpsim.errors import InputError


@pytest.fixture(scope="module")
def model():
    return tpsim.load_model("llama3-8b")


@pytest.fixture(scope="module")
def cluster():
    return tpsim.load_cluster("dgx-h100", gpus=8)


@pytest.mark.parametrize("call, needle", [
    (lambda m, c: tpsim.make_plan(None, 8), "model=NoneType must be a ModelSpec"),
    (lambda m, c: tpsim.make_plan(m, None), "gpus=None must be an integer"),
    (lambda m, c: tpsim.make_plan(m, 8, tp="2"), "tp='2' must be a positive integer"),
    (lambda m, c: tpsim.make_plan(m, 8, global_batch=2**62), "global_batch=4611686018427387904 is above"),
    (lambda m, c: tpsim.estimate(None, c, tpsim.make_plan(m, 8)), "model=NoneType"),
    (lambda m, c: tpsim.estimate(m, "dgx-h100", tpsim.make_plan(m, 8)), "cluster=str must be a Cluster"),
    (lambda m, c: tpsim.estimate(m, c, None), "plan=NoneType must be a Plan"),
    (lambda m, c: tpsim.estimate_batch(m, None, []), "cluster=NoneType"),
])
def test_wrong_arguments_are_one_line_naming_them(model, cluster, call, needle):
    with pytest.raises(InputError) as info:
        call(model, cluster)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_numpy_integers_are_integers(model):
    plan = tpsim.make_plan(model, np.int64(8), tp=np.int32(2), micro_batch=np.int64(1))
    assert plan.tp == 2 and type(plan.tp) is int and plan.dp == 4
    cluster = tpsim.load_cluster("dgx-h100", gpus=np.int64(8))
    assert tpsim.estimate(model, cluster, plan).step_time_s > 0


@pytest.mark.parametrize("call, needle", [
    (lambda m, c: tpsim.make_plan(m, 8, sp="yes"), "sp='yes' must be True or False"),
    (lambda m, c: tpsim.make_plan(m, 8, overlap=1), "overlap=1 must be True or False"),
    (lambda m, c: tpsim.estimate(m, c, tpsim.make_plan(m, 8, tp=8, global_batch=64, zero=0), colour=1),
     "unknown keyword argument 'colour'"),
    (lambda m, c: tpsim.estimate_batch(m, c, [None]), "plans=list must be a PlanBatch"),
    (lambda m, c: tpsim.estimate_batch(m, c, 5), "plans=int must be a PlanBatch"),
    (lambda m, c: tpsim.estimate_batch(m, c, (x for x in ())), "plans=generator must be a PlanBatch"),
])
def test_wrong_types_found_by_the_wave5_probe(model, cluster, call, needle):
    """Issue 26, found by a fresh probe of the API: TypeError/AttributeError from deep inside before."""
    with pytest.raises(InputError) as info:
        call(model, cluster)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("call, needle", [
    (lambda m, c: tpsim.load_model("x" * 10000), "10000 characters"),
    (lambda m, c: tpsim.load_model(None), "model=None must be"),
    (lambda m, c: tpsim.load_cluster(None), "cluster=None must be"),
    (lambda m, c: tpsim.load_cluster("dgx-h100", gpus=True), "gpus=True must be an integer"),
    (lambda m, c: tpsim.load_cluster("dgx-h100", gpus=2**40), "gpus="),
    (lambda m, c: tpsim.estimate(m, c, tpsim.make_plan(m, 8, tp=8), compute=5), "compute=int"),
    (lambda m, c: tpsim.estimate(m, c, tpsim.make_plan(m, 8, tp=8), calibration=[]), "calibration=list"),
    (lambda m, c: tpsim.estimate_batch(m, c, None), "plans=NoneType"),
])
def test_wave6_api_arguments_are_named(model, cluster, call, needle):
    with pytest.raises(InputError) as info:
        call(model, cluster)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_wave6_search_and_runfit_arguments_are_named(model, cluster):
    from tpsim.runfit import compute_calibration, fit_runs
    from tpsim.search import search

    for call, needle in ((lambda: search(model, cluster, None), "global_batch=None"),
                         (lambda: search(model, None, 64), "clusters=NoneType"),
                         (lambda: search(model, cluster, 64, space=5), "space=int"),
                         (lambda: fit_runs([1, 2]), "int is not a Run"),
                         (lambda: compute_calibration({"gemm_scale": float("nan")}), "gemm_scale"),
                         (lambda: compute_calibration({"warp": 1.0}), "unknown factor 'warp'")):
        with pytest.raises(InputError) as info:
            call()
        assert needle in str(info.value), str(info.value)
    assert tpsim.load_cluster("dgx-h100", gpus=np.int64(16)).num_gpus == 16
