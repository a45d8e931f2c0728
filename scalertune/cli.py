"""The ``scalertune`` command: a thin layer over :func:`scalertune.search` and friends."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

from scalertune import _interrupt, _policy
from scalertune._errors import UsageError
from scalertune._storage._open import DEFAULT_STORAGE
from scalertune._text import shown

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult

EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, _interrupt.EXIT_INTERRUPTED
_FLOAT32_MAX = 3.4028234663852886e38

_DESCRIPTION = """\
Find the mixed-precision (AMP) settings that will not NaN on you, and train fastest.

scalertune runs an Optuna study over the autocast dtype, GradScaler's init_scale,
growth_factor, backoff_factor and growth_interval, and the gradient-clipping norm, on your own
model, optimizer and data. It prunes trials that go non-finite and says why, compares every
trial with a float32 reference run and with PyTorch's defaults, confirms the best on other
seeds, and writes the most stable fast config to a YAML file your training code loads.
"""

_EPILOG = """\
exit status:
  0  the search (or report) finished
  1  the workload itself failed (the float32 reference, or every run alike)
  2  bad input: the message says what was wrong and what to do; nothing was written
  130  interrupted (Ctrl-C or SIGTERM): finished trials are kept; rerun the same command
       to resume

see `scalertune COMMAND --help` for each command.
"""

_SEARCH_DESCRIPTION = """\
Search AMP configs for the workload that FACTORY returns, and recommend one.

FACTORY is path/to/model.py:make_model or package.module:make_model: a function returning a
scalertune.Workload or a dict with model, optimizer, batches and loss_fn (or step). It is
called afresh under fixed seeds for every run.

Every study runs, once: a float32 reference (its final loss, within a small tolerance, is the
target), PyTorch's defaults (float16, init_scale 65536, growth 2.0, backoff 0.5, interval
2000, no clipping) and the same with init_scale 4096. Then N-TRIALS sampled configs. Trials
that reach the target rank above those that never do; among them the shortest time to target
wins. The best few are rerun on seeds {seeds} and a config is recommended only if it stays
finite and reaches the target on all of them.

Running the same command again resumes the same study up to N-TRIALS sampled trials.
""".format(seeds=", ".join(map(str, _policy.CONFIRM_SEEDS)))

_SEARCH_EPILOG = """\
examples:
  scalertune search examples/codepoints.py:make_model
  scalertune search model.py:make_model --space float16 --n-trials 40 --device cuda
  scalertune search model.py:make_model --storage postgresql://user@db/optuna --study-name run1

output:
  stdout  the summary table: float32, the two baselines, the best trials, pruned trials
          counted by reason, the recommendation and its verdict against float32
  stderr  one line per finished run (a progress bar on a terminal)
  FILE    the YAML of --output: `config` (what scalertune.load() uses) and `evidence`
"""


_DIAGNOSE_DESCRIPTION = """\
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


#: The valid values of every number option, by the option's name: (integer, lowest, highest,
#: lowest excluded). Checked as soon as the command line is parsed, before any work starts.
_NUMBERS: dict[str, tuple[bool, float, float, bool]] = {
    "--n-trials": (True, 0, math.inf, False),
    "--top": (True, 0, math.inf, False),
    "--steps": (True, 1, _policy.MAX_STEPS, False),
    "--seed": (True, 0, _policy.MAX_SEED, False),
    "--timeout": (False, 0, math.inf, True),
    "--trial-timeout": (False, 0, math.inf, True),
    "--trial-memory": (False, 0, math.inf, True),
    "--init-scale": (False, 0, _FLOAT32_MAX, True),  # the loss scale is a float32 tensor
    "--micro-batch-size": (True, 1, math.inf, False),
    "--port": (True, 1, 65535, False),
}


def _check_numbers(args: argparse.Namespace) -> None:
    """Every number option of ``_NUMBERS`` the command has, within its range."""
    for flag, (integer, low, high, low_excluded) in _NUMBERS.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None:
            continue
        if integer:  # argparse made it an int
            wanted = (f"an integer >= {low}" if high == math.inf
                      else f"an integer from {low} to {high}")
            ok = low <= value <= high
        else:  # NaN fails every comparison below, infinity the last one
            wanted = "a positive finite number" if low_excluded and low == 0 else (
                f"a finite number {'>' if low_excluded else '>='} {low:g}")
            ok = (value > low if low_excluded else value >= low) and math.isfinite(value)
            if ok and value > high:
                raise UsageError(f"{flag} must be at most {high:g}, got {value:g}")
        if not ok:
            got = shown(value) if integer else f"{value:g}"
            raise UsageError(f"{flag} must be {wanted}, got {got}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from scalertune._export._api import (
        FRAMEWORKS,  # loads torch: after Ctrl-C is handled
    )

    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="scalertune", description=_DESCRIPTION, epilog=_EPILOG,
                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("search", help="search AMP configs for a model factory",
                       description=_SEARCH_DESCRIPTION, epilog=_SEARCH_EPILOG,
                       formatter_class=fmt)
    s.add_argument("factory", metavar="FACTORY",
                   help="path/to/model.py:make_model or module:function")
    _storage_arguments(s)
    s.add_argument("--space", default="default", metavar="NAME|FILE",
                   help="search space: default (float16 and bfloat16), float16, bfloat16, or a "
                        "YAML file (default: %(default)s)")
    s.add_argument("--fp32-modules", metavar="NAMES",
                   help="keep these modules in float32 on every float16 trial: float32 "
                        "islands for a forward overflow (see scalertune diagnose). "
                        "Comma-separated names as model.named_modules() gives them, or glob "
                        "patterns over those names ('*.DenseReluDense.wo'); each must match a "
                        "module")
    s.add_argument("--n-trials", type=int, default=24, metavar="N",
                   help="most sampled trials in the study, in total across reruns and workers; "
                        "sampling stops earlier once it stops finding faster configs "
                        "(default: %(default)s)")
    s.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="stop sampling after this many seconds (like Optuna's "
                        "study.optimize(timeout=...)); the baselines and confirmations still run "
                        "(default: no limit)")
    s.add_argument("--steps", type=int, default=200, metavar="N",
                   help="training steps per run (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the search runs (default: 0)")
    s.add_argument("--device", default="auto",
                   help="auto (CUDA if present), cpu, cuda or cuda:N (default: %(default)s)")
    s.add_argument("--output", "-o", metavar="FILE",
                   help="where to write the recommendation (default: STUDY_NAME.yaml here)")
    s.add_argument("--top", type=int, default=5, metavar="N",
                   help="sampled trials shown in the summary (default: %(default)s)")
    s.add_argument("--isolate", action="store_true",
                   help="run every trial in its own process, so a crash, a hang or an "
                        "out-of-memory fails that trial only")
    s.add_argument("--trial-timeout", type=float, metavar="SECONDS",
                   help="with --isolate: kill a trial that runs longer (default: no limit)")
    s.add_argument("--trial-memory", type=float, metavar="GB",
                   help="with --isolate, on CPU: cap each trial's address space")
    s.add_argument("--artifact-dir", metavar="DIR",
                   help="where the PNGs attached to trials are stored, for optuna-dashboard "
                        "(default: scalertune-artifacts here)")
    _quiet_argument(s)

    g = sub.add_parser(
        "diagnose", help="find where float16 overflows or underflows, module by module",
        description=_DIAGNOSE_DESCRIPTION,
        epilog="exit status: 0 diagnosed; 1 the workload raised in float16 (or float32); 2 bad "
        "input (nothing was run)",
        formatter_class=fmt)
    g.add_argument("factory", metavar="FACTORY",
                   help="path/to/model.py:make_model or module:function")
    g.add_argument("--init-scale", type=float, default=2.0**16, metavar="S",
                   help="loss scale of the float16 steps, a positive number (default: 65536, "
                        "PyTorch's)")
    g.add_argument("--fp32-modules", metavar="NAMES", default="",
                   help="modules already kept in float32 (names or glob patterns, as for "
                        "search): diagnose what overflows with them in place")
    g.add_argument("--steps", type=int, default=_policy.DIAGNOSE_STEPS, metavar="N",
                   help="training steps per run (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    _quiet_argument(g)

    e = sub.add_parser(
        "export", help="print the recommendation as code for torch, Lightning, Accelerate, ...",
        description="Print the code that builds the objects a framework takes for the config "
        "in RESULT (a YAML written by scalertune search): the GradScaler and autocast for "
        "torch, the Trainer arguments with their precision plugin for Lightning, the Accelerator "
        "arguments with GradScalerKwargs for Accelerate, TrainingArguments fields for "
        "Transformers, and for DeepSpeed a JSON config to save as ds_config.json (its notes go "
        "to stderr). scalertune.export() returns the same objects in Python. Where the "
        "framework cannot express a searched value, a 'NOT EXPRESSIBLE' comment says so and the "
        "nearest setting is used; --strict makes that an error (exit status 2). 'DIFFERS' "
        "comments say where the framework's scaler behaves otherwise with the same numbers.",
        epilog="examples:\n  scalertune export amp.yaml --to lightning --device cuda\n"
        "  scalertune export amp.yaml --to deepspeed --micro-batch-size 8 > ds_config.json",
        formatter_class=fmt)
    e.add_argument("result", metavar="RESULT.yaml")
    e.add_argument("--to", required=True, choices=FRAMEWORKS, metavar="FRAMEWORK",
                   help=f"one of {', '.join(FRAMEWORKS)}")
    e.add_argument("--device", default="auto",
                   help="what training runs on: auto (CUDA when the training machine has it), "
                        "cuda or cpu (default: %(default)s)")
    e.add_argument("--strict", action="store_true",
                   help="fail instead of approximating what the framework cannot express")
    e.add_argument("--micro-batch-size", type=int, metavar="N",
                   help="with --to deepspeed: write train_micro_batch_size_per_gpu, which "
                        "DeepSpeed requires, so the JSON is a complete ds_config.json")
    _quiet_argument(e)

    d = sub.add_parser(
        "dashboard", help="review the studies of a storage in optuna-dashboard",
        description="Start optuna-dashboard, bound to 127.0.0.1, on the storage and its "
        "studies' artifact stores: it shows every study the storage holds. First refresh the "
        "notes scalertune writes (the study's summary, what each trial is and what happened to "
        "it) on every study, or on --study-name's only; nothing but notes is written. Needs: "
        "pip install 'scalertune[dashboard]'.",
        formatter_class=fmt)
    _storage_arguments(d, study_help="refresh this study's notes only (default: every study's)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    d.add_argument("--port", type=int, default=8080,
                   help="port (default: %(default)s)")
    d.add_argument("--artifact-dir", metavar="DIR",
                   help="artifact store folder (default: the one each study's search used)")
    _quiet_argument(d)

    r = sub.add_parser("report", help="summarise a study from its storage",
                       description="Print the summary of a stored study, recomputed from what "
                       "the storage holds (after several workers, or after a crash).",
                       formatter_class=fmt)
    _storage_arguments(r, study_required=True)
    r.add_argument("--output", "-o", metavar="FILE", help="also write the recommendation YAML")
    r.add_argument("--json", action="store_true", help="print the result as JSON instead")
    r.add_argument("--top", type=int, default=5, metavar="N",
                   help="sampled trials shown in the summary (default: %(default)s)")
    _quiet_argument(r)
    return parser


_QUIET_HELP = ("print results only: no per-run lines or progress bar, no notes on stderr "
               "(errors are still printed)")


def _quiet_argument(p: argparse.ArgumentParser) -> None:
    """-q after the command too; SUPPRESS keeps a -q given before the command."""
    p.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                   help=_QUIET_HELP)


def _storage_arguments(p: argparse.ArgumentParser, *, study_required: bool = False,
                       study_help: str = "the study (default for search: FILE_STEM:FUNCTION of "
                                         "the factory)") -> None:
    p.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL|FILE",
                   help="Optuna storage URL (sqlite:///..., postgresql://...), or the path of a "
                        "journal file for several workers on one host (default: %(default)s)")
    p.add_argument("--study-name", required=study_required, metavar="NAME", help=study_help)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``scalertune`` command line; return its exit status."""
    return _main(argv, exiting=False)


def program() -> NoReturn:
    """The ``scalertune`` executable: exit with the status of the command line. A Ctrl-C or
    SIGTERM that arrives once the command is done cannot change that status."""
    sys.exit(_main(None, exiting=True))


def _main(argv: Sequence[str] | None, *, exiting: bool) -> int:
    with _interrupt.handled():
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            if args.command is None:
                parser.print_usage(sys.stderr)
                print(f"{parser.prog}: error: name a command: search, diagnose, export, report "
                      f"or dashboard (see {parser.prog} --help)", file=sys.stderr)
                return EXIT_USAGE
            code = _run(args)
        except KeyboardInterrupt:  # before a search opened its study, or outside a search
            print("scalertune: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        if exiting:
            _interrupt.settle()
        return code


def _run(args: argparse.Namespace) -> int:
    import optuna

    # scalertune prints its own line per run; Optuna's would repeat them less clearly.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        _check_numbers(args)
        return {"search": _search, "report": _report, "dashboard": _dashboard,
                "diagnose": _diagnose, "export": _export}[args.command](args)
    except UsageError as exc:
        print(f"scalertune {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        # Only a search raises SearchError, and only once it has imported its module (and
        # torch): a bad option is refused before either loads.
        search_module = sys.modules.get("scalertune._search._api")
        if search_module is None or not isinstance(exc, search_module.SearchError):
            raise
        print(f"scalertune {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except SystemExit as exc:  # the user's module or step called sys.exit() outside a run
        print(f"scalertune {args.command}: error: the workload called sys.exit({exc.code!r}): "
              "return from the factory instead, and keep script code under "
              "if __name__ == '__main__':", file=sys.stderr)
        return EXIT_USAGE


def _search(args: argparse.Namespace) -> int:
    output = _check_search(args)
    from scalertune._search._api import Isolation, search  # after the checks: it loads torch
    from scalertune._storage._open import owned_files

    quiet = args.quiet
    isolation = Isolation(args.trial_timeout, args.trial_memory) if args.isolate else None
    new_files = [f for f in owned_files(args.storage) if not os.path.exists(f)]
    try:
        result = search(
            args.factory, storage=args.storage, study_name=args.study_name, space=args.space,
            fp32_modules=args.fp32_modules, n_trials=args.n_trials, steps=args.steps,
            seed=args.seed, device=args.device, timeout=args.timeout,
            isolation=isolation,
            log=None if quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
            progress=not quiet and sys.stderr.isatty(),
        )
    except UsageError:  # refused once the storage was open (a reference that did not learn)
        _remove_if_unused(args.storage, new_files)
        raise
    print(result.summary(top=args.top))
    if result.interrupted:
        return EXIT_INTERRUPTED
    with _interrupt.deferred():  # the YAML and the study's notes are written whole or not
        _write(result, output, args.artifact_dir, sys.stdout)
    return EXIT_INTERRUPTED if _interrupt.received() else 0


def _remove_if_unused(storage: str, new_files: list[str]) -> None:
    """Remove the files this command created for a storage that holds no study: input
    refused after the storage was opened leaves nothing behind."""
    if not new_files:
        return
    import optuna

    from scalertune._storage._open import open_storage

    try:
        opened = open_storage(storage, must_exist=True)
        empty = not optuna.get_all_study_summaries(opened, include_best_trial=False)
        engine = getattr(opened, "engine", None)
        if engine is not None:
            engine.dispose()
    except Exception:  # nothing is removed that cannot be shown to be empty
        return
    if empty:
        for path in new_files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _check_search(args: argparse.Namespace) -> str:
    """What can be checked of a search's input before any work: the options that go
    together, the space, the study name, the storage's files and the output; returns the
    output file."""
    from scalertune._search._space import SearchSpace

    if (args.trial_timeout is not None or args.trial_memory is not None) and not args.isolate:
        raise UsageError("--trial-timeout and --trial-memory need --isolate")
    SearchSpace.load(args.space)  # read again by the search; here it is refused before torch
    from scalertune._search._study import default_study_name

    study_name = args.study_name or default_study_name(args.factory)
    _check_study_name(study_name)
    output = args.output or _default_output(study_name)
    factory_file = args.factory.rpartition(":")[0]
    inputs = {"factory file": factory_file, "search space file": args.space}
    _check_storage_and_output(args.storage, output, args.artifact_dir, inputs)
    return output


def _check_study_name(name: str) -> None:
    from optuna.storages._rdb.models import MAX_INDEXED_STRING_LENGTH

    if len(name) > MAX_INDEXED_STRING_LENGTH:
        raise UsageError(f"the study name is {len(name)} characters long; Optuna's storages hold "
                         f"at most {MAX_INDEXED_STRING_LENGTH}: pass a shorter --study-name")


def _check_storage_and_output(storage: str, output: str | None, artifact_dir: str | None,
                              inputs: dict[str, str]) -> None:
    """The storage's own files must be usable, and the output YAML (and the PNGs written
    beside it) must be a new or regular file, in a folder that exists, that is none of the
    files the study owns or the search reads."""
    from scalertune._review._dashboard import DEFAULT_ARTIFACT_DIR
    from scalertune._storage._open import check_local, owned_files

    check_local(storage)
    artifacts = os.path.abspath(artifact_dir or DEFAULT_ARTIFACT_DIR)
    if artifact_dir is not None and os.path.exists(artifacts) and not os.path.isdir(artifacts):
        raise UsageError(f"--artifact-dir {artifact_dir} is a file: name a folder")
    if artifact_dir is not None and any(_same(artifacts, f) for f in owned_files(storage)):
        raise UsageError(f"--artifact-dir {artifact_dir} is the study's storage: name a folder")
    if output is None:
        return
    path = os.path.abspath(output)
    if os.path.isdir(path):
        raise UsageError(f"--output {output} is a folder: name a file, e.g. "
                         f"{os.path.join(output, 'amp.yaml')}")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise UsageError(f"--output {output}: the folder {folder} does not exist: create it, "
                         "or write the YAML elsewhere")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {output}: the folder {folder} is not writable")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"--output {output} is not a regular file: name a YAML file")
    longest = os.path.splitext(os.path.basename(path))[0] + _LONGEST_PICTURE_SUFFIX
    limit = _name_max(folder)
    if len(os.path.basename(path) + ".tmp") > limit or len(longest) > limit:
        raise UsageError(f"--output {output}: the file names written there (up to "
                         f"{len(longest)} characters) exceed this file system's {limit}: "
                         "pass a shorter --output (or --study-name)")
    owned = {f: "storage" for f in owned_files(storage)}
    owned.update({f: what for what, f in inputs.items() if f and os.path.isfile(f)})
    for file, what in owned.items():
        if _same(path, file):
            raise UsageError(f"--output {output} is the study's {what}: writing the YAML there "
                             "would destroy it; pass another --output")
    if path == artifacts or path.startswith(artifacts + os.sep):
        raise UsageError(f"--output {output} is inside the artifact folder {artifacts}, which "
                         "the study owns: pass another --output")


#: The longest name a picture written beside the YAML takes after its stem
#: (``STEM.pytorch-default.trial-N.png``, N up to ten digits).
_LONGEST_PICTURE_SUFFIX = ".pytorch-default.trial-0123456789.png"


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no answer
        return 255


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file: the same path, a symlink to it, or a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _write(result: "SearchResult", output: str, artifact_dir: str | None,
           stream: Any | None) -> None:
    """The YAML, the pictures beside it, and what the dashboard shows; ``stream`` (if any)
    says what was written."""
    from scalertune._review._dashboard import publish

    result.to_yaml(output)
    pictures = result.write_pictures(output)
    if stream is not None:
        print(f"Wrote {', '.join([output, *pictures.values()])}", file=stream)
    try:
        publish(result, pictures=pictures, artifact_dir=artifact_dir)
    except Exception as exc:  # the YAML is written; the dashboard extras must not undo that
        print(f"scalertune: could not add notes and pictures to the study: {exc}",
              file=sys.stderr)


def _report(args: argparse.Namespace) -> int:
    from scalertune._storage._open import load_existing_study
    from scalertune._storage._redact import redact

    _check_study_name(args.study_name)
    _check_storage_and_output(args.storage, args.output, None, {})
    study = load_existing_study(args.storage, args.study_name)
    from scalertune._amp._schema import result_document
    from scalertune._review._result import analyze  # after the checks: it loads torch

    result = analyze(study, storage=redact(args.storage))
    if args.json:
        print(json.dumps(result_document(result.to_dict()), indent=2))
    else:
        print(result.summary(top=args.top))
    if args.output:
        note = None if args.quiet else sys.stderr
        with _interrupt.deferred():
            _write(result, args.output, None, note if args.json else sys.stdout)
    return EXIT_INTERRUPTED if _interrupt.received() else 0


def _export(args: argparse.Namespace) -> int:
    from scalertune._export._api import export

    result = export(args.result, args.to, device=args.device, strict=args.strict,
                    micro_batch_size=args.micro_batch_size)
    print(result.code, end="")
    if args.to == "deepspeed" and not args.quiet:
        # JSON has no comments: what the code text would say in them goes beside it.
        print("\n".join(result.comments()), file=sys.stderr)
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._device import resolve_device
    from scalertune._diagnose._api import TrainingFailed, diagnose
    from scalertune._run._preflight import preflight
    from scalertune._workload._loader import FactoryError, load_factory

    islands = AmpConfig(fp32_modules=args.fp32_modules).fp32_modules
    device = resolve_device(args.device)
    factory = load_factory(args.factory)
    try:
        preflight(factory, device=device, seed=args.seed, islands=set(islands))
    except FactoryError as exc:
        raise UsageError(f"the factory {args.factory} raised {exc}: fix it and rerun") from None
    try:
        result = diagnose(factory, init_scale=args.init_scale, steps=args.steps,
                          seed=args.seed, device=device, fp32_modules=islands)
    except TrainingFailed as exc:
        print(f"scalertune diagnose: {exc}", file=sys.stderr)
        return EXIT_FAILED
    kept = f", with {','.join(islands)} in float32" if islands else ""
    print(f"scalertune diagnose {args.factory}: {args.steps} steps each in float32, bfloat16 "
          f"and float16 (init_scale {args.init_scale:g}{kept}), on {device}\n")
    print(result.summary())
    command = result.next_command(args.factory)
    if command:
        print(f"\nNext: {command}")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    import optuna

    from scalertune._review._dashboard import have_dashboard, serve
    from scalertune._storage._open import load_existing_studies, load_existing_study
    from scalertune._storage._redact import redact

    if not have_dashboard():
        raise UsageError("optuna-dashboard is not installed: pip install 'scalertune[dashboard]'")
    if args.study_name is not None:
        _check_study_name(args.study_name)
    if args.artifact_dir is not None and not os.path.isdir(args.artifact_dir):
        raise UsageError(f"--artifact-dir {args.artifact_dir} is not a folder: name the folder "
                         "the search stored its pictures in")
    if args.study_name is None:
        studies = load_existing_studies(args.storage)
    else:
        studies = [load_existing_study(args.storage, args.study_name)]
    base = f"http://{args.host}:{args.port}/dashboard"
    lines = [f"optuna-dashboard on {redact(args.storage)} at {base} (Ctrl-C stops it)"]
    lines += [f"  {s.study_name}: {base}/studies/{s._study_id}" for s in studies]  # noqa: SLF001
    print("\n".join(lines), flush=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        serve(studies, storage_url=args.storage, host=args.host, port=args.port,
              artifact_dir=args.artifact_dir)
    except KeyboardInterrupt:
        pass
    return 0


def _default_output(study_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", study_name) + ".yaml"


def _version() -> str:
    from scalertune import __version__

    return __version__


if __name__ == "__main__":
    program()
