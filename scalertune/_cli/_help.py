"""The command line's help texts."""

from scalertune import _policy

DESCRIPTION = """\
Find the mixed-precision (AMP) settings that will not NaN on you, and train fastest.

scalertune runs an Optuna study over the autocast dtype, GradScaler's init_scale,
growth_factor, backoff_factor and growth_interval, and the gradient-clipping norm, on your own
model, optimizer and data. It prunes trials that go non-finite and says why, compares every
trial with a float32 reference run and with PyTorch's defaults, confirms the best on other
seeds, and writes the most stable fast config to a YAML file your training code loads.
"""


EPILOG = """\
exit status:
  0  the search (or report) finished
  1  the workload itself failed (the float32 reference, or every run alike)
  2  bad input: the message says what was wrong and what to do; nothing was written
     (an output path that cannot be written, found before anything runs, is bad input)
  3  a fault outside the workload: the storage or the artifact store stayed unreachable
     past the outage bound, a storage or an output file that could not be written (a
     full disk: the message names it; `report -o` writes the file again), or evidence
     stayed missing after its retries; nothing is lost: rerun the same command once the
     storage is back, and the study resumes
  130  interrupted (Ctrl-C or SIGTERM): finished trials are kept; rerun the same command
       to resume

see `scalertune COMMAND --help` for each command.
"""


SEARCH_DESCRIPTION = """\
Search AMP configs for the workload that FACTORY returns, and recommend one.

FACTORY is path/to/model.py:make_model or package.module:make_model: a function returning a
scalertune.Workload or a dict with model, optimizer, batches and loss_fn (or step), or the
trainer you have. It is called afresh under fixed seeds for every run. A dict with
"deepspeed": config (or a Hugging Face Trainer made with deepspeed=) is searched in
DeepSpeed's own engine, in the knobs of DeepSpeed's loss scaler, against DeepSpeed's defaults.

Every study runs, once: a float32 reference (its final loss, within a small tolerance, is the
target), PyTorch's defaults (float16, init_scale 65536, growth 2.0, backoff 0.5, interval
2000, no clipping), the same with init_scale 4096 where the replay of float32's gradients
tells the two apart (over a --horizon longer than a trial, PyTorch's defaults alone: the
replay says what other scaler settings would do there), and torchao's default recipe
(float8 tensorwise) where the space searches float8 (alone in a float8-only space). Then
N-TRIALS sampled configs. Trials that reach the target rank above
those that never do; among them the shortest time to target wins. The best few are rerun
on seeds {seeds} (the next seed in place of the search's own --seed) and a config is
recommended only if it stays finite and reaches the target on all of them.

Running the same command again resumes the same study up to N-TRIALS sampled trials.
""".format(seeds=", ".join(map(str, _policy.CONFIRM_SEEDS)))


SEARCH_EPILOG = """\
examples:
  scalertune search examples/codepoints.py:make_model
  scalertune search model.py:make_model --space float16 --n-trials 40 --device cuda
  scalertune search model.py:make_model --storage postgresql://user@db/optuna --study-name run1
  scalertune search model.py:make_model --horizon 20000 --storage postgresql://user@db/optuna \\
      --study-name run1 --artifact-dir s3://amp-runs    # workers on several hosts

output:
  stdout  the summary table: float32, the baselines, the best trials, pruned trials
          counted by reason, the recommendation and its verdict against float32
  stderr  one line per finished run (a progress bar on a terminal)
  FILE    the YAML of --output: `config` (what scalertune.load() uses) and `evidence`
"""


DIAGNOSE_DESCRIPTION = """\
Find where float16 overflows or underflows in FACTORY's workload, module by module, and what
fixes it.

A few training steps run in float32, bfloat16 and float16 (at --init-scale), with hooks on
every module: its output, the gradient into that output, and its parameters' gradients as
the scaled float16 backward leaves them. The table shows, in execution order, the largest
magnitudes and the share of values beyond float16's limits; then come the modules whose own
computation turned finite inputs into inf/NaN, and the verdict: a forward overflow (keep
those modules in float32 with search --fp32-modules, or use bfloat16), gradient overflow (a
smaller scale), underflow (a larger scale), or clean.

Every claim is checked with real GradScaler steps, listed in the output: the islands it
suggests make the forward finite, the init_scale it suggests skips no step.
"""


QUIET_HELP = (
    "print results only: no per-run lines or progress bar, no notes on stderr "
    "(errors are still printed)"
)

EXPORT_DESCRIPTION = (
    "Print the code that builds the objects a framework takes for the config in RESULT (a "
    "YAML written by scalertune search): the GradScaler and autocast for torch, the Trainer "
    "arguments with their precision plugin for Lightning, the Accelerator arguments with "
    "GradScalerKwargs for Accelerate, TrainingArguments fields for Transformers, and for "
    "DeepSpeed a JSON config to save as ds_config.json (its notes go to stderr; a DeepSpeed "
    "workload's answer is its searched fp16 block, in the searched config). For "
    "Transformers, Lightning and Accelerate it also shows the scalertune.attach call that "
    "puts the whole config into the trainer, with the guard and the watch (TrainingArguments "
    "has no loss-scaler settings: attach is how its knobs get in). --best-amp exports the "
    "best AMP config that held where the search answered float32 (a CPU). A float8 config "
    "also exports to torchao (Float8LinearConfig, the filter of the layers it converts, "
    "convert_to_float8_training) and torchtitan (its float8 converter's config); DeepSpeed "
    "has no float8. "
    "scalertune.export() returns the same objects in Python. Where the framework cannot "
    "express a searched value, a 'NOT EXPRESSIBLE' comment says so and the nearest setting is "
    "used; --strict makes that an error (exit status 2). 'DIFFERS' comments say where the "
    "framework's scaler behaves otherwise with the same numbers."
)
EXPORT_EPILOG = (
    "examples:\n  scalertune export amp.yaml --to lightning --device cuda\n"
    "  scalertune export amp.yaml --to transformers --best-amp\n"
    "  scalertune export amp.yaml --to deepspeed --micro-batch-size 8 > "
    "ds_config.json"
)
DASHBOARD_DESCRIPTION = (
    "Start optuna-dashboard, bound to 127.0.0.1, on the storage and its studies' artifact "
    "stores: it shows every study the storage holds. First refresh the notes scalertune writes "
    "(the study's summary, what each trial is and what happened to it) on every study, or on "
    "--study-name's only; nothing but notes is written. The dashboard is read-only: a "
    "request that would change the storage is refused (403) unless --allow-writes. Needs: "
    "pip install 'scalertune[dashboard]'."
)
REPORT_DESCRIPTION = (
    "Print the summary of a stored study, recomputed from what the storage "
    "holds (after several workers, or after a crash)."
)
DIAGNOSE_EPILOG = (
    "exit status: 0 diagnosed; 1 the workload raised in float16 (or float32); "
    "2 bad input (nothing was run)"
)
STORAGE_HELP = (
    "Optuna storage URL (sqlite:///..., postgresql://...), a SQLite file (.db, "
    ".sqlite), or the path of a journal file for several workers on one host "
    "(default: %(default)s)"
)
