"""The command line's parser: one function per command, errors in one line.

Options are never abbreviated (``--step 50`` is an error, not ``--steps 50``), and a
mistyped command or option gets the closest names as a suggestion.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import scalertune._cli._help as _help
from scalertune import _policy
from scalertune._storage._open import DEFAULT_STORAGE

EXIT_USAGE = 2
_FMT = argparse.RawDescriptionHelpFormatter


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, and no option is taken
    for another by its prefix."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, formatter_class=_FMT, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {message}{_suggestion(self, message)} (see {self.prog} --help)\n",
        )


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``: did you mean --steps?`` for an unknown option or command close to a real one."""
    choice = re.search(r"invalid choice: '([^']*)'", message)
    commands = _commands(parser)
    if choice and commands:
        return _closest(choice.group(1), list(commands))
    return ""


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name (none for a command's own parser)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps the commands here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices
    return {}


def _closest(word: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f": did you mean {' or '.join(close)}?" if close else ""


def parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The parsed command line, or an exit status when there is no command to run."""
    parser = build()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = _commands(parser).get(args.command, parser) if args.command else parser
        known = [o for a in command._actions for o in a.option_strings]  # noqa: SLF001
        unknown = next((e for e in extra if e.startswith("-")), extra[0])
        command.error(
            f"unrecognized arguments: {' '.join(extra)}{_closest(unknown.split('=')[0], known)}"
        )
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: name a command: search, diagnose, export, report "
            f"or dashboard (see {parser.prog} --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return args


def build() -> argparse.ArgumentParser:
    """The ``scalertune`` parser with its five commands."""
    parser = _Parser(prog="scalertune", description=_help.DESCRIPTION, epilog=_help.EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--quiet", "-q", action="store_true", help=_help.QUIET_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _search(sub)
    _diagnose(sub)
    _export(sub)
    _dashboard(sub)
    _report(sub)
    return parser


def _search(sub: Any) -> None:
    s = sub.add_parser(
        "search",
        help="search AMP configs for a model factory",
        description=_help.SEARCH_DESCRIPTION,
        epilog=_help.SEARCH_EPILOG,
    )
    s.add_argument(
        "factory", metavar="FACTORY", help="path/to/model.py:make_model or module:function"
    )
    _storage_arguments(s)
    _space_arguments(s)
    s.add_argument(
        "--n-trials",
        type=int,
        default=24,
        metavar="N",
        help="most sampled trials in the study, in total across reruns and workers; "
        "sampling stops earlier once it stops finding faster configs "
        "(default: %(default)s)",
    )
    s.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop sampling after this many seconds (like Optuna's "
        "study.optimize(timeout=...)); the baselines and confirmations still run "
        "(default: no limit)",
    )
    s.add_argument(
        "--steps",
        type=int,
        default=_policy.SEARCH_STEPS,
        metavar="N",
        help="training steps per trial (default: %(default)s, or all of a shorter training "
        "the factory declares)",
    )
    s.add_argument(
        "--horizon",
        type=int,
        metavar="N",
        help="training steps the evidence must cover: the steps your training runs, "
        "or the part of it you want covered. The float32 reference trains "
        "that far once; the finalists are trained from step 0 as far as a "
        "cost cap of 3 horizons allows, and branched from its checkpoints for "
        "the late phases they do not reach (default: what the factory "
        "declares, else --steps)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the search runs; the best are confirmed on two others (default: 0)",
    )
    _device_argument(s, "auto (CUDA if present), cpu, cuda or cuda:N (default: %(default)s)")
    s.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="where to write the recommendation (default: STUDY_NAME.yaml here)",
    )
    _top_argument(s)
    _run_arguments(s)
    _host_arguments(s)
    _quiet_argument(s)


def _space_arguments(s: Any) -> None:
    """What a search searches: the space, and the modules every float16 trial keeps in float32."""
    s.add_argument(
        "--space",
        default="default",
        metavar="NAME|FILE",
        help="search space: default (float16 and bfloat16; float8 too on a GPU of CUDA "
        "capability 8.9+ with torchao), float16, bfloat16, float8 (torchao's recipes: pip "
        "install 'scalertune[float8]'), or a YAML file (default: %(default)s)",
    )
    s.add_argument(
        "--fp32-modules",
        metavar="NAMES",
        help="keep these modules in float32 on every float16 and float8 trial: float32 "
        "islands for a forward overflow (see scalertune diagnose). "
        "Comma-separated names as model.named_modules() gives them, or glob "
        "patterns over those names ('*.DenseReluDense.wo'); each must match a "
        "module",
    )


def _host_arguments(s: Any) -> None:
    """The bounds of a search whose runs span hosts under the user's launcher."""
    s.add_argument(
        "--rendezvous-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="under torchrun --nnodes or srun (the same command on every host): how long "
        "the ranks wait for each other to come; the ranks that did not are named "
        "(default: 300)",
    )
    s.add_argument(
        "--host-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="under torchrun --nnodes or srun: how long a rank waits for rank 0's word, or "
        "rank 0 for a rank's report, before it ends the search on every host with status "
        "3; the same command reruns it (default: 300)",
    )


def _run_arguments(s: Any) -> None:
    """Where and how a search's runs execute: their processes, their limits, their files."""
    s.add_argument(
        "--isolate",
        action="store_true",
        help="run every trial in its own process, so a crash, a hang or an "
        "out-of-memory fails that trial only",
    )
    s.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="run every run as N processes of one torch.distributed group, as "
        "torchrun --nproc-per-node N runs your script: the factory is called "
        "in each rank, with the group up, and wraps its model (DDP, FSDP) "
        "itself; gloo on CPU, NCCL with one GPU per rank (default: the "
        "factory's nproc_per_node attribute, else 1)",
    )
    s.add_argument(
        "--independent-ranks",
        action="store_true",
        help="with --nproc-per-node: the ranks train copies of their own on purpose (an "
        "ensemble); without it a factory whose ranks' weights differ after the first step "
        "(no DistributedDataParallel, FSDP or gradient all-reduce) is refused",
    )
    s.add_argument(
        "--trial-timeout",
        type=float,
        metavar="SECONDS",
        help="with --isolate or --nproc-per-node: kill a trial that runs longer "
        "(default: no limit)",
    )
    s.add_argument(
        "--trial-memory",
        type=float,
        metavar="GB",
        help="with --isolate or --nproc-per-node, on CPU: cap each trial's "
        "(each rank's) address space",
    )
    s.add_argument(
        "--wait-for-storage",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for a storage server that is not up as the search "
        "starts (connection refused, host unknown): workers a scheduler starts "
        "while the database restarts, or beside its container; past it, exit "
        "status 3 (default: 0, said at once: a wrong host or port is likelier)",
    )
    s.add_argument(
        "--artifact-dir",
        metavar="DIR|s3://BUCKET",
        help="the study's artifact store: its float32 checkpoints and the PNGs "
        "optuna-dashboard shows. A folder, or s3://BUCKET (boto3's endpoint "
        "and credentials: AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ...) for "
        "workers on several hosts. Recorded in the study: other workers, "
        "report and dashboard find it where it lies beside the SQLite or journal "
        "file, or is a bucket; elsewhere each names it again (default: "
        "scalertune-artifacts beside a SQLite or journal file, else here)",
    )


def _diagnose(sub: Any) -> None:
    g = sub.add_parser(
        "diagnose",
        help="find where float16 overflows or underflows, module by module",
        description=_help.DIAGNOSE_DESCRIPTION,
        epilog=_help.DIAGNOSE_EPILOG,
    )
    g.add_argument(
        "factory", metavar="FACTORY", help="path/to/model.py:make_model or module:function"
    )
    g.add_argument(
        "--init-scale",
        type=float,
        default=2.0**16,
        metavar="S",
        help=(
            "loss scale of the float16 steps, from float32's smallest normal (2**-126) up "
            "(default: 65536, PyTorch's)"
        ),
    )
    g.add_argument(
        "--fp32-modules",
        metavar="NAMES",
        default="",
        help="modules already kept in float32 (comma-separated names or glob patterns, "
        "as for search): diagnose what overflows with them in place",
    )
    g.add_argument(
        "--steps",
        type=int,
        default=_policy.DIAGNOSE_STEPS,
        metavar="N",
        help="training steps per run (default: %(default)s)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    _device_argument(g, "auto, cpu, cuda or cuda:N (default: auto)")
    _quiet_argument(g)


def _export(sub: Any) -> None:
    from scalertune._export._api import FRAMEWORKS  # after Ctrl-C is handled

    e = sub.add_parser(
        "export",
        help="print the recommendation as code for torch, Lightning, Accelerate, ...",
        description=_help.EXPORT_DESCRIPTION,
        epilog=_help.EXPORT_EPILOG,
    )
    e.add_argument("result", metavar="RESULT.yaml")
    e.add_argument(
        "--to",
        required=True,
        choices=FRAMEWORKS,
        metavar="FRAMEWORK",
        help=f"one of {', '.join(FRAMEWORKS)}",
    )
    _device_argument(
        e,
        "what training runs on: auto (CUDA when the training machine has it), "
        "cuda or cpu (default: %(default)s)",
    )
    e.add_argument(
        "--strict",
        action="store_true",
        help="fail instead of approximating what the framework cannot express",
    )
    e.add_argument(
        "--micro-batch-size",
        type=int,
        metavar="N",
        help="with --to deepspeed: write train_micro_batch_size_per_gpu, which "
        "DeepSpeed requires, so the JSON is a complete ds_config.json",
    )
    e.add_argument(
        "--best-amp",
        action="store_true",
        help="export the best AMP config that held (evidence.best_amp) instead of "
        "the answer: where a search on a CPU answered float32, for a GPU",
    )
    _quiet_argument(e)


def _dashboard(sub: Any) -> None:
    d = sub.add_parser(
        "dashboard",
        help="review the studies of a storage in optuna-dashboard",
        description=_help.DASHBOARD_DESCRIPTION,
    )
    _storage_arguments(d, study_help="refresh this study's notes only (default: every study's)")
    d.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: %(default)s); optuna-dashboard has no login: anyone "
        "who reaches another address reads the study",
    )
    d.add_argument("--port", type=int, default=8080, help="port (default: %(default)s)")
    d.add_argument(
        "--allow-writes",
        action="store_true",
        help="let the dashboard change the storage (notes, trial feedback, deleting a "
        "study): anyone who reaches it could; by default it is read-only",
    )
    d.add_argument(
        "--artifact-dir",
        metavar="DIR|s3://BUCKET",
        help="the artifact store to show (default: the one each study records, where it "
        "lies beside its SQLite or journal file)",
    )
    _quiet_argument(d)


def _report(sub: Any) -> None:
    r = sub.add_parser(
        "report", help="summarise a study from its storage", description=_help.REPORT_DESCRIPTION
    )
    _storage_arguments(r, study_help="the study (default: the storage's only study)")
    r.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="also write the YAML of the recommendation (or of --trial)",
    )
    r.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="with --output: write the YAML of trial N's config instead of the "
        "recommendation's, with that trial's evidence",
    )
    r.add_argument("--json", action="store_true", help="print the result as JSON instead")
    r.add_argument(
        "--artifact-dir",
        metavar="DIR|s3://BUCKET",
        help="with --output: the artifact store the pictures go to (default: the one the "
        "study records, where it lies beside its SQLite or journal file)",
    )
    _top_argument(r)
    _quiet_argument(r)


def _quiet_argument(p: argparse.ArgumentParser) -> None:
    """-q after the command too; SUPPRESS keeps a -q given before the command."""
    p.add_argument(
        "--quiet", "-q", action="store_true", default=argparse.SUPPRESS, help=_help.QUIET_HELP
    )


def _top_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="N",
        help="sampled trials shown in the summary (default: %(default)s)",
    )


def _device_argument(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--device", default="auto", help=help_text)


def _storage_arguments(
    p: argparse.ArgumentParser,
    *,
    study_help: str = "the study (default: FILE_STEM:FUNCTION of the factory)",
) -> None:
    p.add_argument(
        "--storage", default=DEFAULT_STORAGE, metavar="URL|FILE", help=_help.STORAGE_HELP
    )
    p.add_argument("--study-name", metavar="NAME", help=study_help)


def _version() -> str:
    from scalertune import __version__

    return __version__
