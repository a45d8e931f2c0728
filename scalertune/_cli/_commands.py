"""The five commands: each checks its input, calls the Python API and prints what it returns."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult

import contextlib

from scalertune import _interrupt
from scalertune._cli._files import (
    _check_not_narrower,
    _check_storage_and_output,
    _check_study_name,
    _default_output,
    _remove_if_unused,
)
from scalertune._cli._flags import check_numbers, from_flags
from scalertune._errors import StorageUnavailable, UsageError
from scalertune._storage._open import storage_url
from scalertune._text import plural
from scalertune._workload._loader import check_spec

#: What ends with the command, whatever its status: under the user's launcher, rank 0 tells
#: the other ranks the search is over (``cli._run`` calls each with the exit status).
CLOSING: list[Callable[[int], None]] = []


def _search(args: argparse.Namespace) -> int:
    check_spec(args.factory)  # before the storage's and the space's modules load
    from scalertune._processes._world import launched

    try:
        world = launched()
    except ValueError as exc:
        raise UsageError(
            f"this search runs under a launcher whose environment is incomplete ({exc}): "
            "start it with torchrun or srun, which set it"
        ) from None
    if world is not None:
        return _search_on_hosts(args, world)
    return _search_here(args)


def _search_on_hosts(args: argparse.Namespace, world: Any) -> int:
    """The same command on every rank of the user's launcher: rank 0 searches, leading the
    others' runs; each other rank runs its part of every run and ends with rank 0's status
    (:mod:`scalertune._processes._hosts`)."""
    if args.nproc_per_node is not None:
        raise UsageError(
            f"--nproc-per-node is {world.launcher}'s under {world.launcher}: drop it (each "
            f"host runs the {world.local_size} ranks its launcher started)"
        )
    from scalertune._processes import _launcher
    from scalertune._processes._hosts import Crew

    crew = Crew.join(
        world, rendezvous_timeout=args.rendezvous_timeout, host_timeout=args.host_timeout
    )
    if world.rank != 0:
        code = crew.follow()
        if code:
            print(
                f"scalertune search: {crew.where(0)} ended the search with status {code}: "
                "its output says why",
                file=sys.stderr,
            )
        elif not args.quiet:  # a silent host reads as one that did nothing
            print(
                f"scalertune search: done; {crew.where(0)} printed the summary and wrote "
                "the study's answer",
                file=sys.stderr,
            )
        return code
    _launcher.lead(crew)
    CLOSING.append(crew.close)
    other = crew.other_command()
    if other is not None:
        raise UsageError(
            f"{crew.where(other)} runs another command than rank 0 "
            f"({crew.argv_difference(other)}): run the same command on every host"
        )
    args.nproc_per_node = world.local_size
    args.hosts = tuple(crew.hosts)
    return _search_here(args)


def _search_here(args: argparse.Namespace) -> int:
    args.storage = storage_url(args.storage)
    output = _check_search(args)
    from scalertune._search._api import run_search  # after the checks: it loads torch
    from scalertune._search._options import Isolation, SearchOptions
    from scalertune._storage._open import owned_files

    quiet = args.quiet
    hosts = getattr(args, "hosts", ())  # under the user's launcher: the hosts a run spans
    isolation = (
        Isolation(
            args.trial_timeout,
            args.trial_memory,
            independent_ranks=args.independent_ranks,
            nnodes=max(1, len(hosts)),
            hosts=hosts,
        )
        if args.isolate or (args.nproc_per_node or 1) > 1 or args.independent_ranks or hosts
        else None
    )
    options = from_flags(
        SearchOptions,
        args,
        isolation=isolation,
        log=None if quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
        progress=not quiet and sys.stderr.isatty(),
    )
    new_files = [f for f in owned_files(args.storage) if not os.path.exists(f)]
    # stdout is the summary's: what the user's code prints while it runs (a model's greeting,
    # in every run's process too) goes to stderr, with the search's own lines
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = run_search(args.factory, options)
    except UsageError:  # refused once the storage was open (a reference that did not learn)
        _remove_if_unused(args.storage, new_files)
        raise
    print(result.summary(top=args.top))
    if result.interrupted:
        return EXIT_INTERRUPTED
    with _interrupt.deferred():  # the YAML and the study's notes are written whole or not
        _write(result, output, args.artifact_dir, sys.stdout)
    if _interrupt.received():
        return EXIT_INTERRUPTED
    if result.missing:
        print(
            f"scalertune search: the evidence of {plural(len(result.missing), 'run')} is "
            "missing (see 'Missing evidence' above): rerun the same command to complete it",
            file=sys.stderr,
        )
        return EXIT_STORAGE
    return 0


def _check_search(args: argparse.Namespace) -> str:
    """What can be checked of a search's input before any work: the options that go
    together, the space, the study name, the storage's files and the output; returns the
    output file."""
    from scalertune._search._space import SearchSpace

    if (
        (args.trial_timeout is not None or args.trial_memory is not None)
        and not args.isolate
        and (args.nproc_per_node or 1) == 1
        and not getattr(args, "hosts", ())
    ):
        raise UsageError("--trial-timeout and --trial-memory need --isolate (or --nproc-per-node)")
    SearchSpace.load(args.space)  # read again by the search; here it is refused before torch
    from scalertune._workload._loader import default_study_name

    study_name = default_study_name(args.factory) if args.study_name is None else args.study_name
    _check_study_name(study_name)
    output = args.output or _default_output(study_name)
    factory_file = args.factory.rpartition(":")[0]
    inputs = {"factory file": factory_file, "search space file": args.space}
    _check_storage_and_output(args.storage, output, args.artifact_dir, inputs)
    return output


def _write(
    result: SearchResult,
    output: str,
    artifact_dir: str | None,
    stream: Any | None,
    *,
    publish_notes: bool = True,
) -> None:
    """The YAML, the pictures beside it, and what the dashboard shows; ``stream`` (if any)
    says what was written."""
    from scalertune._review._dashboard import publish
    from scalertune._storage._open import first_line

    _check_not_narrower(output, result.horizon)
    try:
        result.to_yaml(output)
        pictures = result.write_pictures(output)
    except OSError as exc:  # a full disk, a read-only folder: each file is written whole
        # the storage as given, where it hides no password (which it could not say)
        storage = result.storage if result.storage and "***" not in result.storage else ""
        again = (
            f"scalertune report --storage {shlex.quote(storage) if storage else 'STORAGE'} "
            f"--study-name '{result.study_name}' -o FILE writes them again"
        )
        # checked writable before the search: a fault of the machine since, nothing lost
        raise StorageUnavailable(
            f"cannot write {exc.filename or output}: {exc.strerror or exc}: free "
            f"space or pass another --output; the study keeps everything ({again})"
        ) from None
    if stream is not None:
        print(f"Wrote {', '.join([output, *pictures.values()])}", file=stream)
    if not publish_notes:
        return
    try:
        publish(result, pictures=pictures, artifact_dir=artifact_dir)
    except Exception as exc:  # the YAML is written; the dashboard extras must not undo that
        print(
            f"scalertune: could not add notes and pictures to the study: {first_line(exc)}",
            file=sys.stderr,
        )


def _report(args: argparse.Namespace) -> int:
    from scalertune._storage._open import load_existing_study
    from scalertune._storage._redact import redact

    args.storage = storage_url(args.storage)
    if args.trial is not None and not args.output:
        raise UsageError("--trial N writes trial N's YAML: give --output FILE too")
    if args.study_name is not None:
        _check_study_name(args.study_name)
    _check_storage_and_output(args.storage, args.output, args.artifact_dir, {})
    study = load_existing_study(args.storage, args.study_name)
    if args.output:  # the factory file the study was searched with is not overwritten either
        from scalertune._judge._settings import StudySettings

        factory = StudySettings.of(study).factory.rpartition(":")[0]
        if factory:
            inputs = {"factory file": factory}
            _check_storage_and_output(args.storage, args.output, args.artifact_dir, inputs)
    if args.output and args.trial is None:  # its pictures go to the study's store
        from scalertune._storage._store import location_of

        location_of(study, args.artifact_dir)  # refused here, before a word is written
    from scalertune._amp._schema import result_document
    from scalertune._review._analyze import analyze

    result = analyze(study, storage=redact(args.storage))
    # a trial that is no finished run is refused before a word is printed
    written = result if args.trial is None else result.for_trial(args.trial)
    if args.json:
        print(json.dumps(result_document(result.to_dict()), indent=2))
    else:
        print(result.summary(top=args.top))
    if args.output:
        note = None if args.quiet else sys.stderr
        with _interrupt.deferred():
            _write(
                written,
                args.output,
                args.artifact_dir,
                note if args.json else sys.stdout,
                publish_notes=args.trial is None,
            )
    return EXIT_INTERRUPTED if _interrupt.received() else 0


def _export(args: argparse.Namespace) -> int:
    from scalertune._export._api import export

    result = export(
        args.result,
        args.to,
        device=args.device,
        strict=args.strict,
        micro_batch_size=args.micro_batch_size,
        best_amp=args.best_amp,
    )
    print(result.code, end="")
    if args.to == "deepspeed" and not args.quiet:
        # JSON has no comments: what the code text would say in them goes beside it.
        print("\n".join(result.comments()), file=sys.stderr)
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._device import resolve_device
    from scalertune._diagnose._api import diagnose
    from scalertune._diagnose._runner import TrainingFailed
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
        result = diagnose(
            factory,
            init_scale=args.init_scale,
            steps=args.steps,
            seed=args.seed,
            device=device,
            fp32_modules=islands,
        )
    except TrainingFailed as exc:
        print(f"scalertune diagnose: {exc}", file=sys.stderr)
        return EXIT_FAILED
    kept = f", with {','.join(islands)} in float32" if islands else ""
    print(
        f"scalertune diagnose {args.factory}: {args.steps} steps each in float32, bfloat16 "
        f"and float16 (init_scale {args.init_scale:g}{kept}), on {device}\n"
    )
    print(result.summary())
    command = result.next_command(args.factory)
    if command:
        print(f"\nNext: {command}")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    import optuna

    args.storage = storage_url(args.storage)
    from scalertune._review._dashboard import have_dashboard, serve
    from scalertune._storage._open import load_existing_studies, load_existing_study
    from scalertune._storage._optuna import study_id
    from scalertune._storage._redact import redact

    if not have_dashboard():
        raise UsageError("optuna-dashboard is not installed: pip install 'scalertune[dashboard]'")
    if args.study_name is not None:
        _check_study_name(args.study_name)
    from scalertune._storage._store import is_bucket, normalized

    if args.artifact_dir is not None and not (
        is_bucket(args.artifact_dir) or os.path.isdir(args.artifact_dir)
    ):
        raise UsageError(
            f"--artifact-dir {args.artifact_dir} is not a folder: name the folder "
            "the search stored its pictures in"
        )
    if args.artifact_dir is not None:
        args.artifact_dir = normalized(args.artifact_dir)
    if args.study_name is None:
        studies = load_existing_studies(args.storage)
    else:
        studies = [load_existing_study(args.storage, args.study_name)]
    from scalertune._storage._store import location_of

    for study in studies:  # a store refused here, before the server is announced
        location_of(study, args.artifact_dir)
    _check_bindable(args.host, args.port)  # before the server is announced
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address, as URLs have it
    base = f"http://{host}:{args.port}/dashboard"
    lines = [f"optuna-dashboard on {redact(args.storage)} at {base} (Ctrl-C stops it)"]
    lines += [f"  {s.study_name}: {base}/studies/{study_id(s)}" for s in studies]
    print("\n".join(lines), flush=True)
    _say_who_reaches(args, base)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            serve(
                studies,
                storage_url=args.storage,
                host=args.host,
                port=args.port,
                artifact_dir=args.artifact_dir,
                writable=args.allow_writes,
            )
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise UsageError(
            f"cannot serve at {args.host}:{args.port}: {exc.strerror}: pass another --host "
            "or --port"
        ) from None
    return 0


def _say_who_reaches(args: argparse.Namespace, base: str) -> None:
    """Who can change the studies (``--allow-writes``), and who reads them (an address other
    than loopback), each in one line: optuna-dashboard has no login."""
    if args.allow_writes:
        print(
            "--allow-writes: optuna-dashboard has no login, so anyone who reaches "
            f"{base} (any user of this host, at a loopback address) can rewrite the "
            "studies' notes and delete them",
            file=sys.stderr,
            flush=True,
        )
    if not _loopback(args.host):
        print(
            f"--host {args.host} is not a loopback address: optuna-dashboard has no login, so "
            f"anyone who reaches {base} reads the study (bind 127.0.0.1 and reach it through "
            "an SSH tunnel to keep it to yourself)",
            file=sys.stderr,
            flush=True,
        )


def _check_bindable(host: str, port: int) -> None:
    """:class:`UsageError` where the server could not listen at ``host``:``port``: a name
    that resolves to no address, an address of no interface here, a port taken or
    privileged (tried by binding it, and letting it go at once)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(
            f"cannot serve at {host}:{port}: {host} is no address of this machine "
            f"({exc.strerror}): pass another --host (127.0.0.1 by default)"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UsageError(
                f"cannot serve at {host}:{port}: {exc.strerror}: pass another --host or --port"
            ) from None


def _loopback(host: str) -> bool:
    """Whether ``host`` is reached from this machine alone: ``localhost``, 127.0.0.0/8, ::1
    (an address of all interfaces, ``0.0.0.0`` or ``::``, or any other name, is not)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


EXIT_FAILED, EXIT_INTERRUPTED = 1, _interrupt.EXIT_INTERRUPTED
#: A fault outside the workload stopped the command: the storage or the artifact store stayed
#: unreachable, or evidence stayed missing after its retries. Nothing is lost: rerun.
EXIT_STORAGE = 3


def _checked(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, after the numbers it was given are checked (before torch loads)."""

    def run(args: argparse.Namespace) -> int:
        check_numbers(args)
        import optuna

        # scalertune prints its own line per run; Optuna's would repeat them less clearly.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        return command(args)

    return run


#: Command name -> what runs it.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "search": _checked(_search),
    "report": _checked(_report),
    "dashboard": _checked(_dashboard),
    "diagnose": _checked(_diagnose),
    "export": _checked(_export),
}
