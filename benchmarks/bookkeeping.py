"""The search's bookkeeping: what one decision costs on a study of 15, 150 and 1500 trials.

Between two runs a worker asks its study what to do: whether to sample more (the stop rule,
``Pipeline._sample_more``), what a run about to start is up against (a finished twin of its
config, the best run so far for its stop rule) and what the evidence says
(:func:`~scalertune._judge._answer.judge`, which every once-per-study job asks). One
**decision** here is those questions, asked of the real search objects (a ``Pipeline`` on
the study, as ``scalertune.search`` builds it), right after one more run finished: the study
grows by one finished trial before each decision, as it does in a search.

The studies are written without training, by the search's own writers: the float32
references of the search's seed and of the confirmation seeds (``add_reference``), the
baselines and the sampled runs (configs the default space's sampler proposes; their judged
figures, curves and constraints stored by ``_judged.store``, ``store_curves`` and
``store_constraint``), completed, pruned (slower than the best) and failed in the proportions
of a real search; each run a trial of 200 steps. The reference's gradient trace is left out
(decoding one is cached on its own, :mod:`scalertune._judge._reference`).

Two ways are timed side by side on the same study:

- **kept**: one ``Pipeline`` for every decision, as one worker keeps one for its search: its
  :class:`~scalertune._judge._view.StudyView` checks and reads each finished trial once and
  reads again only what is new or still running;
- **afresh**: a new ``Pipeline`` (so a new view) for each decision: every finished trial is
  checked and read again at every decision, the floor of what the search paid before the
  view (it checked each trial several times a decision).

The bookkeeping must grow linearly in the trials (each decision reads what is new, and
passes over the study's runs once), not as trials x decisions: the figure to watch is the
cost per decision at 1500 trials over that at 150 (10x at most). Each figure is the median
over the decisions of the wall time (what the search waits: on PostgreSQL each read is a
round trip to the server) and of this process's CPU time; the spread is the lowest and
highest median of ``BLOCKS`` consecutive blocks of decisions. ``first`` is the kept view's
first decision, which reads the whole study once. Storages: a SQLite file, and PostgreSQL
when a server is given (``--postgres URL``, or ``SCALERTUNE_TEST_POSTGRES``): a database of
its own per study, dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import optuna
import torch
from optuna.trial import TrialState
from torch import nn

from scalertune import _policy
from scalertune._amp._config import AmpConfig, baselines
from scalertune._judge._judged import store
from scalertune._judge._target import Target
from scalertune._run._record import RunRecord
from scalertune._run._step_times import StepTimes
from scalertune._search._options import SearchOptions
from scalertune._search._pipeline import Pipeline
from scalertune._search._progress import Progress
from scalertune._search._setup import Setup, prepare
from scalertune._search._study import (
    add_reference,
    judged_of,
    objective_value,
    open_study,
    relative_curve,
    store_constraint,
    store_curves,
)
from scalertune._search._trials import _finished_twin
from scalertune._storage._names import ROLE_BASELINE, ROLE_SEARCH, TRACEBACK_ATTR
from scalertune._storage._open import open_storage
from scalertune._storage._optuna import set_system_attr
from scalertune._storage._recovery import WORKER, retry
from scalertune._storage._trial_record import Job, Marks

SIZES = (15, 150, 1500)
STEPS = 200
#: Decisions timed per study and way (each after one more run finished).
DECISIONS = 24
#: Consecutive blocks whose medians make the spread.
BLOCKS = 4
#: The share of sampled runs pruned as slower than the best, and failed: a default search's.
PRUNED, FAILED = 0.3, 0.05


def tiny() -> dict[str, Any]:
    """The workload the search is prepared with (its settings and space): no run trains."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    w = torch.randn(8, 1)
    batches = [(x, x @ w) for x in (torch.randn(32, 8) for _ in range(4))]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


class _Writer:
    """Writes a study the way a search of the ``setup`` does, run by run, without training:
    each run's attributes written by the search's writers to a trial of a scratch study in
    memory (where the space's sampler proposed its config), then added to the study in one
    write (``study.add_trial``), finished."""

    def __init__(self, study: optuna.Study, setup: Setup) -> None:
        self.study, self.setup = study, setup
        self.random = random.Random(0)
        self.target: Target | None = None

    def references(self) -> None:
        times = StepTimes({d: [2e-3 * self.random.uniform(0.9, 1.1)] * 8 for d in _DTYPES}, 40)
        for seed in (self.setup.seed, *_policy.CONFIRM_SEEDS):
            record = RunRecord(
                config=AmpConfig(dtype="float32"),
                seed=seed,
                steps=STEPS,
                losses=self._losses(STEPS),
                window_step_times=[2e-3] * (STEPS // 10),
            )
            add_reference(
                self.study,
                record,
                record.config,
                times if seed == self.setup.seed else None,
                settings=self.setup.settings,
                checkpoints={},
            )
            if seed == self.setup.seed:
                self.target = Target.from_reference(record.losses)

    def baselines(self) -> None:
        for name, config in baselines(False).items():
            config = config.with_clip(self.setup.clip_norm)
            queue = optuna.create_study()  # queued as the search queues it, by its dtype
            queue.enqueue_trial({"dtype": config.dtype})
            trial = queue.ask()
            trial.suggest_categorical("dtype", self.setup.space.dtype_choices)
            self.run(trial, config, role=ROLE_BASELINE, baseline=name)

    def sampled(self) -> None:
        """One config the space's sampler proposes, run as a search runs it."""
        # a proposal of its own each: the sampler draws at random before it has runs to model
        proposer = optuna.create_study(
            sampler=self.setup.space.sampler(seed=self.random.randrange(2**31))
        )
        trial = proposer.ask()
        config = self.setup.space.suggest(trial).with_clip(self.setup.clip_norm)
        self.run(trial, config, role=ROLE_SEARCH)

    def run(self, trial: optuna.Trial, config: AmpConfig, *, role: str, **attrs: Any) -> None:
        draw = self.random.random()
        state = (
            TrialState.FAIL
            if role == ROLE_SEARCH and draw < FAILED
            else TrialState.PRUNED
            if role == ROLE_SEARCH and draw < FAILED + PRUNED
            else TrialState.COMPLETE
        )
        Marks(worker=WORKER).write(trial)
        Job(role, seed=0, config=config, **attrs).write(trial)
        record = self._record(config, state)
        assert self.target is not None
        value = None
        if state == TrialState.FAIL:
            Marks(error="RuntimeError: CUDA error: an illegal memory access").write(trial)
            set_system_attr(trial, TRACEBACK_ATTR, "Traceback (most recent call last):\n" * 8)
        else:
            judged = judged_of(record, self.target, 2e-3)
            store(trial, judged)
            store_curves(trial, record)
            store_constraint(trial, self.target.gap(record.losses))
            if state == TrialState.COMPLETE:
                value = min(objective_value(judged), 1e300)
        written = trial.study.tell(trial, state=TrialState.FAIL)
        self.study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value,
                params=written.params,
                distributions=written.distributions,
                intermediate_values=relative_curve(record.losses, self.target),
                user_attrs=written.user_attrs,
                system_attrs=written.system_attrs,
            )
        )

    def _record(self, config: AmpConfig, state: TrialState) -> RunRecord:
        steps = STEPS if state == TrialState.COMPLETE else self.random.choice((40, 80, 120))
        scales = [] if not config.uses_scaler else self._scales(config, steps)
        pruned = state == TrialState.PRUNED
        return RunRecord(
            config=config,
            seed=0,
            steps=STEPS,
            losses=self._losses(steps),
            scales=scales,
            window_step_times=[2e-3] * (steps // 10),
            prune_kind="slower" if pruned else None,
            prune_reason="slower than the best: cannot reach the target first" if pruned else None,
            stopped="slower" if pruned else None,
        )

    def _losses(self, steps: int) -> list[float]:
        return [2.0 * 0.985**i * self.random.uniform(0.9, 1.1) for i in range(steps)]

    def _scales(self, config: AmpConfig, steps: int) -> list[float]:
        scale, out = float(config.init_scale), []
        for _ in range(steps):
            if self.random.random() < 0.02:
                scale *= config.backoff_factor
            out.append(scale)
        return out


_DTYPES = ("float32", "float16", "bfloat16")


def decide(pipeline: Pipeline, config: AmpConfig, target: Target) -> None:
    """One decision's questions, as the search asks them (see the module)."""
    pipeline._sample_more()  # noqa: SLF001 -- the search's own stop question, asked as it asks it
    view = pipeline.view
    trials = view.trials()
    _finished_twin(view, trials, config, 0, len(trials))
    pipeline.runner.rules.stop_rule(ROLE_SEARCH, config, target, trials)
    pipeline.jobs.findings()


@contextlib.contextmanager
def storages(postgres: str | None) -> Iterator[Callable[[str], str]]:
    """A function that gives a fresh, empty storage URL of each kind (``sqlite``,
    ``postgresql``); PostgreSQL's databases are dropped afterwards."""
    made: list[str] = []
    with tempfile.TemporaryDirectory() as folder:

        def fresh(kind: str) -> str:
            name = f"bookkeeping_{os.getpid()}_{len(made)}"
            made.append(name)
            if kind == "sqlite":
                return f"sqlite:///{os.path.join(folder, name + '.db')}"
            assert postgres is not None
            _postgres_sql(postgres, f"CREATE DATABASE {name}")
            return postgres.rsplit("/", 1)[0] + "/" + name

        try:
            yield fresh
        finally:
            if postgres is not None:
                for name in made:
                    _postgres_sql(postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _postgres_sql(server: str, statement: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(
        server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
    )
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(statement))
    finally:
        engine.dispose()


def _timed(work: Callable[[], None]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.process_time() - cpu, time.perf_counter() - wall


def _summary(costs: list[tuple[float, float]], which: int) -> dict[str, float]:
    values = [c[which] for c in costs]
    size = max(1, len(values) // BLOCKS)
    blocks = [statistics.median(values[i : i + size]) for i in range(0, len(values), size)]
    return {
        "ms": statistics.median(values) * 1e3,
        "low": min(blocks) * 1e3,
        "high": max(blocks) * 1e3,
    }


def measure_one(url: str, setup: Setup, trials: int, decisions: int) -> dict[str, Any]:
    """A study of ``trials`` runs on ``url``; then ``decisions`` decisions each way, the two
    ways interleaved decision by decision (each after one more run finished)."""
    study, _ = open_study(
        open_storage(url, on_stale_trial=retry),
        "bookkeeping",
        setup.settings,
        seed=0,
        url=url,
        space=setup.space,
    )
    writer = _Writer(study, setup)
    writer.references()
    writer.baselines()
    while len(study.get_trials(deepcopy=False)) < trials:
        writer.sampled()
    assert writer.target is not None
    target, config = writer.target, AmpConfig(init_scale=4096.0)
    progress = Progress(None, bar=False)
    kept = Pipeline(study, setup, progress, timeout=None)
    first = _timed(lambda: decide(kept, config, target))
    costs: dict[str, list[tuple[float, float]]] = {"kept": [], "afresh": []}
    for n in range(decisions):
        writer.sampled()
        afresh = Pipeline(study, setup, progress, timeout=None)
        ways = [("kept", kept), ("afresh", afresh)]
        for way, pipeline in ways if n % 2 == 0 else ways[::-1]:
            costs[way].append(_timed(lambda p=pipeline: decide(p, config, target)))
    return {
        "trials": trials,
        "first_ms": first[1] * 1e3,
        **{
            f"{way}_{kind}": _summary(c, i)
            for way, c in costs.items()
            for i, kind in enumerate(("cpu", "wall"))
        },
    }


def measure(
    *, postgres: str | None, sizes: tuple[int, ...] = SIZES, decisions: int = DECISIONS
) -> list[dict[str, Any]]:
    """One row per storage and study size (see the module)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    torch.set_num_threads(1)
    options = SearchOptions(
        storage=None,
        study_name=None,
        space="default",
        fp32_modules=None,
        n_trials=10**6,  # never the reason a decision stops sampling
        steps=STEPS,
        horizon=None,
        seed=0,
        device="cpu",
        timeout=None,
        isolation=None,
        artifact_dir=None,
        nproc_per_node=None,
        wait_for_storage=0.0,
        log=None,
        progress=False,
    )
    setup = prepare(tiny, options)
    rows = []
    kinds = ["sqlite"] + (["postgresql"] if postgres else [])
    with storages(postgres) as fresh:
        for kind in kinds:
            for trials in sizes:
                rows.append({"storage": kind, **measure_one(fresh(kind), setup, trials, decisions)})
    return rows


def _cell(s: dict[str, float]) -> str:
    return f"{s['ms']:8.2f} ({s['low']:.2f}-{s['high']:.2f})"


def report(rows: list[dict[str, Any]]) -> list[str]:
    """The table: per storage and size, ms per decision each way, and the growth from one
    size to the next (x10 trials each)."""
    lines = [
        f"{'storage':<10} {'trials':>6} {'first':>8}   {'kept wall ms':<24} {'kept CPU ms':<24}"
        f" {'afresh wall ms':<24} {'afresh/kept':>11}"
    ]
    for r in rows:
        lines.append(
            f"{r['storage']:<10} {r['trials']:>6} {r['first_ms']:8.1f}   "
            f"{_cell(r['kept_wall']):<24} {_cell(r['kept_cpu']):<24} {_cell(r['afresh_wall']):<24}"
            f" {r['afresh_wall']['ms'] / r['kept_wall']['ms']:>10.1f}x"
        )
    lines.append("")
    lines.append("growth per decision, x10 trials (wall time; 10x is linear):")
    for kind in dict.fromkeys(r["storage"] for r in rows):
        mine = [r for r in rows if r["storage"] == kind]
        for a, b in zip(mine, mine[1:]):
            lines.append(
                f"  {kind:<10} {a['trials']:>5} -> {b['trials']:<5} kept "
                f"{b['kept_wall']['ms'] / a['kept_wall']['ms']:5.1f}x   afresh "
                f"{b['afresh_wall']['ms'] / a['afresh_wall']['ms']:5.1f}x"
            )
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres",
        default=os.environ.get("SCALERTUNE_TEST_POSTGRES"),
        help="a PostgreSQL server's URL (postgresql://user@host:port/db); a database of its "
        "own is made there per study and dropped afterwards",
    )
    parser.add_argument("--decisions", type=int, default=DECISIONS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args()
    rows = measure(postgres=args.postgres, sizes=tuple(args.sizes), decisions=args.decisions)
    print(
        f"ms per decision, median of {args.decisions} (spread: lowest-highest median of "
        f"{BLOCKS} blocks); first: the kept view's first decision (wall ms)"
    )
    if not args.postgres:
        print("PostgreSQL: no server given (--postgres URL or SCALERTUNE_TEST_POSTGRES)")
    print("\n".join(report(rows)))
