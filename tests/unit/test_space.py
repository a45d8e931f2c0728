"""Search spaces: shipped by name, read from a path, validated before anything runs."""

import math

import optuna
import pytest

from scalertune import SearchSpace, UsageError
from scalertune._storage._optuna import storage_of
from scalertune._storage._recovery import retry
from scalertune._storage._trial_record import Retry


@pytest.mark.parametrize("name", ["default", "float16", "bfloat16"])
def test_shipped_spaces_load_by_name(name):
    space = SearchSpace.load(name)
    assert space.name == name and space.description


def test_a_space_file_loads_by_path(space_file):
    path = space_file(
        "dtype: {choices: [float16]}\ninit_scale: {low: 1, high: 1024, log: true}\n",
        name="mine.yaml",
    )
    space = SearchSpace.load(path)
    assert space.name == "mine" and space.dtypes == ("float16",)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "init_scale: {low: 0, high: 8}",
            r"init_scale must be a number, finite and at least 2\*\*-126",
        ),
        ("init_scale: -1", r"init_scale must be a number, finite and at least 2\*\*-126"),
        ("growth_factor: {low: 1.0, high: 2}", "growth_factor must be > 1"),
        ("backoff_factor: {low: 0.5, high: 1.0}", r"backoff_factor must be in \(0, 1\)"),
        ("backoff_factor: 0", r"backoff_factor must be in \(0, 1\)"),
        ("growth_interval: {low: 100, high: 10}", "low .100. is greater than high .10."),
        ("dtype: {choices: [float4]}", "unknown dtype 'float4'"),
        ("float8_recipe: {choices: [blockwise]}", "float8_recipe must be one of"),
        (
            "float8_recipe: {choices: [rowwise, rowwise_gw_hp]}",
            r"float8_recipe must be one of, .*rowwise_with_gw_hp; got 'rowwise_gw_hp'$",
        ),
        ("dtype: {choices: [float32]}", "unknown dtype 'float32'"),
        ("loss_scale: {low: 1, high: 2}", "unknown key.s. loss_scale"),
        ("init_scale: {low: 1, high: 2, scale: log}", "unknown key.s. scale"),
        ("init_scale: {low: 1}", "needs both low and high"),
        ("clip_norm: {low: 0, high: 1}", "clip_norm must be > 0"),
        ("init_scale: {low: 1, high: 2, optional: true}", "only clip_norm can be optional"),
        ("init_scale: {low: 1, high: 4, log: true, step: 1}", "log and step cannot be combined"),
        ("- just\n- a list", "must be a mapping"),
        ("init_scale: [unclosed", "not valid YAML"),
    ],
)
def test_invalid_space_values_are_refused_by_name(space_file, text, message):
    with pytest.raises(UsageError, match=message):
        SearchSpace.load(space_file(text))


def test_unknown_space_name_lists_the_shipped_ones():
    with pytest.raises(UsageError, match="unknown search space 'fp8'.*bfloat16, default, float16"):
        SearchSpace.load("fp8")


def test_scaler_knobs_are_searched_only_when_float16_is_chosen():
    space = SearchSpace.load("default")
    study = optuna.create_study(sampler=space.sampler(seed=3))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        config = space.suggest(trial)
        seen.add(config.dtype)
        has_scaler_params = "init_scale" in trial.params
        assert has_scaler_params == (config.dtype == "float16")
        if config.dtype == "bfloat16":
            assert not config.uses_scaler
        study.tell(trial, 1.0)
    assert seen == {"float16", "bfloat16"}


def test_a_run_queued_again_after_a_fault_leaves_the_sampled_configs_as_undisturbed():
    """A run that lost its evidence (a host gone) fails and is queued again as a new trial,
    and a float32 reference's attempt killed midway leaves a failed trial behind (the next
    attempt resumes from its checkpoint): the configs sampled after either are those of the
    undisturbed search, so the answer does not depend on when the fault hit (each trial's
    stream is seeded by its number, less the trials a fault added). A sampled config that
    raised stays counted, so the next trial samples another."""
    space = SearchSpace.load("default")

    def value(config):  # the objective stands for a run: a function of the config alone
        return abs(math.log2(config.init_scale or 1.0) - 3) + (config.clip_norm or 0.0)

    def reference(study, failed=False):
        trial = study.ask()
        trial.set_user_attr("role", "reference")
        if failed:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, 1.0)

    def sampled(fault_at=None, reference_killed=False):
        study = optuna.create_study(sampler=space.sampler(seed=5))
        if reference_killed:
            reference(study, failed=True)
        for _ in range(3):
            reference(study)
        configs = []
        while len(configs) < 14:
            trial = study.ask()
            trial.set_user_attr("role", "search")
            config = space.suggest(trial)
            if len(configs) == fault_at:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                assert retry(study, study.trials[trial.number])
                copy = study.ask()  # the copy, run where the failed run stood
                assert Retry.sound(study.trials[copy.number]).retry_history == (trial.number,)
                study.tell(copy, value(space.suggest(copy)))
            else:
                study.tell(trial, value(config))
            configs.append(config)
        return configs

    undisturbed = sampled()
    assert sampled(fault_at=3) == undisturbed
    assert sampled(reference_killed=True) == undisturbed
    assert len(set(map(repr, undisturbed))) > 10  # sampled, not one point again and again
    # a config that raised (no copy queued: the config's failure, not a fault's)
    study = optuna.create_study(sampler=space.sampler(seed=5))
    first = study.ask()
    first.set_user_attr("role", "search")
    raised = space.suggest(first)
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    second = study.ask()
    second.set_user_attr("role", "search")
    assert space.suggest(second) != raised


def test_workers_sharing_a_study_and_its_seed_sample_different_configs():
    # Each worker builds the sampler with the study's seed; drawn from one stream, two
    # workers proposed the same config side by side and trained it twice at once.
    space = SearchSpace.load("default")
    study = optuna.create_study()
    workers = [
        optuna.load_study(
            study_name=study.study_name, storage=storage_of(study), sampler=space.sampler(seed=0)
        )
        for _ in range(2)
    ]
    same = 0
    for i in range(8):
        trials = [w.ask() for w in workers]
        configs = [space.suggest(t) for t in trials]
        same += configs[0] == configs[1]
        for w, t in zip(workers, trials):
            w.tell(t, float(i + t.number))
    assert same <= 4  # only the space's single points ("bfloat16, no clip") may coincide
    # One worker stays reproducible.
    runs = []
    for _ in range(2):
        one = optuna.create_study(sampler=space.sampler(seed=3))
        runs.append([space.suggest(one.ask()) for _ in range(5)])
    assert runs[0] == runs[1]
