"""``benchmarks/bookkeeping.py`` runs against the search's own code: it calls private
functions of the search (the questions one decision asks), so a change of their signatures
must fail here, not when someone next measures."""

import importlib.util
import pathlib
import sys

BENCHMARK = pathlib.Path(__file__).parents[2] / "benchmarks" / "bookkeeping.py"


def test_the_bookkeeping_benchmark_measures_a_small_study_both_ways():
    spec = importlib.util.spec_from_file_location("bookkeeping_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        rows = module.measure(postgres=None, sizes=(12,), decisions=2)
        table = module.report(rows)
    finally:
        del sys.modules[spec.name]
    (row,) = rows
    assert row["storage"] == "sqlite" and row["trials"] == 12
    assert row["kept_wall"]["ms"] > 0 and row["afresh_wall"]["ms"] > 0
    assert table[1].split()[:2] == ["sqlite", "12"]
