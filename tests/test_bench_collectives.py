"""`tpsim bench-collectives`: 2 gloo ranks, tiny sizes, bounded time; rows readable by `tpsim calibrate`."""

import multiprocessing

import pytest

from tpsim.errors import InputError

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(120)
def test_gloo_two_ranks_rows(tmp_path):
    pytest.importorskip("torch")
    from tpsim.bench.collectives import COLUMNS, run_bench, write_csv
    from tpsim.collectives.calibration import read_measurements

    rows = run_bench(2, "gloo", sizes=[4096, 65536], ops=["all_reduce", "all_gather", "reduce_scatter"],
                     iters=2, warmup=1, timeout_s=30)  # bounded by timeout_s and the test timeout
    assert len(rows) == 3 * 2 * 2
    assert {(r.op, r.bytes) for r in rows} == {(op, s) for op in ("all_reduce", "all_gather", "reduce_scatter")
                                              for s in (4096, 65536)}
    assert all(r.backend == "gloo" and r.nranks == 2 and 0 < r.time_s < 5 for r in rows)
    assert not multiprocessing.active_children()  # every rank reaped
    out = tmp_path / "bench.csv"
    text = write_csv(rows, out)
    assert text.splitlines()[0] == ",".join(COLUMNS)
    assert len(read_measurements([out])) == len(rows)


def test_bad_arguments_fail_before_spawning():
    from tpsim.bench.collectives import run_bench

    with pytest.raises(InputError, match="--nproc"):
        run_bench(1)
    with pytest.raises(InputError, match="--ops"):
        run_bench(2, ops=["gather"])
    with pytest.raises(InputError, match="--sizes"):
        run_bench(2, sizes=[0])
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        with pytest.raises(InputError, match="nccl"):
            run_bench(2, backend="nccl")


@pytest.mark.timeout(120)
def test_failing_ranks_are_reported_and_reaped(monkeypatch):
    """A backend the ranks cannot start (MPI is not built in): one-line BenchError, no process left."""
    pytest.importorskip("torch")
    import tpsim.bench.collectives as bench

    monkeypatch.setattr(bench, "_check", lambda *a, **k: None)  # let the bad backend reach the ranks
    with pytest.raises(bench.BenchError, match="rank"):
        bench.run_bench(2, "mpi", sizes=[4096], ops=["all_reduce"], iters=1, warmup=0, timeout_s=20)
    assert not multiprocessing.active_children()
