"""Run the scalertune command line with a fault planted where a random moment finds it only by
chance.

    python fault_launcher.py SIGNAL N ARGS...

sends SIGNAL (INT, TERM or KILL) to this very process at the N-th moment inside a storage
write. The moments are, on SQLite and PostgreSQL, just before and just after each SQL statement
that changes a table, just before each commit and just after it; on a journal file, just
before and just after each append. Only the main thread's writes count (Optuna's heartbeat
thread writes on its own).

    python fault_launcher.py checkpoint HOW N ARGS...

once the N-th checkpoint is stored whole with its checksum, damages its file (HOW:
``truncated``, ``emptied``, ``garbled``, ``gone``, or ``intact``) as a disk, a copy or a person
would, and SIGKILLs this process: a worker that dies the moment its evidence is damaged.
HOW ``planted`` replaces it, as someone who can write the artifact store but not the workers
would, with a ``torch.save`` file whose pickle runs a command on load (it creates the file
named by ``SCALERTUNE_TEST_PLANTED``, or ``planted-ran`` in the current folder), and rewrites
its manifest to the new file's checksum and size; ``foreign`` replaces it, the same way, with
a real checkpoint of another model (the file a run saved, its keys and shapes not the
workload's).

    python fault_launcher.py lose HOW ARGS...

once the float32 reference is stored, damages (HOW, as above) every checkpoint it saved,
and goes on: the branches must find float32's checkpoints damaged after the reference.

    python fault_launcher.py outage SECONDS ARGS...

runs with the storage outage bound (``STORAGE_OUTAGE_S``) set to SECONDS.

    python fault_launcher.py fsize BYTES ARGS...

runs with no file written past BYTES (``RLIMIT_FSIZE``): a write that would grow one further
fails with "File too large", as on a full disk.
"""

import os
import signal
import sys
import threading


def _arm(signum: int, n: int) -> None:
    count = 0

    def maybe_fire() -> None:
        nonlocal count
        if threading.current_thread() is not threading.main_thread():
            return
        count += 1
        if count == n:
            os.kill(os.getpid(), signum)

    import sqlalchemy
    import sqlalchemy.orm
    from optuna.storages.journal import JournalFileBackend

    def around_execute(conn, cursor, statement, *args):
        if statement.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            maybe_fire()

    for event in ("before_cursor_execute", "after_cursor_execute"):
        sqlalchemy.event.listen(sqlalchemy.engine.Engine, event, around_execute)
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "commit", lambda conn: maybe_fire())
    sqlalchemy.event.listen(sqlalchemy.orm.Session, "after_commit", lambda session: maybe_fire())
    append = JournalFileBackend.append_logs

    def append_logs(self, logs):
        maybe_fire()
        append(self, logs)
        maybe_fire()

    JournalFileBackend.append_logs = append_logs


class Planted:
    """What a pickle that runs a command as it is loaded holds: ``__reduce__`` names
    ``os.system`` and its argument, and an unrestricted unpickler calls it."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def planted_command() -> str:
    import shlex

    mark = os.environ.get("SCALERTUNE_TEST_PLANTED", os.path.abspath("planted-ran"))
    return f"touch {shlex.quote(mark)}"


def _foreign_body(step: int) -> bytes:
    """A real scalertune checkpoint of another model (a wider MLP), at ``step``."""
    import tempfile

    import torch

    from scalertune._amp._config import AmpConfig
    from scalertune._run._loop import Plan, run_config

    def other():
        model = torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.Linear(7, 2))
        x, y = torch.randn(8, 3), torch.randn(8, 2)
        return {
            "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            "loss_fn": torch.nn.MSELoss(),
            "batches": [(x, y)],
        }

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "other.pt")
        config = AmpConfig(dtype="float32")
        run_config(
            other,
            config,
            steps=step,
            seed=0,
            device=torch.device("cpu"),
            plan=Plan(save_at={step: path}),
        )
        with open(path, "rb") as f:
            return f.read()


def _replace_with_matching_manifest(stored, body: bytes) -> None:
    """The file replaced by ``body``, and its manifest rewritten to match: whoever can write
    one can write the other (a study key's signature, where there is one, stays as it was)."""
    import hashlib
    import io
    import json

    manifest = json.loads(stored.store.read(stored.name + ".json", lambda f: f.read()))
    stored.store.inner.write(stored.name, io.BytesIO(body))
    manifest.update(sha256=hashlib.sha256(body).hexdigest(), bytes=len(body))
    stored.store.inner.write(stored.name + ".json", io.BytesIO(json.dumps(manifest).encode()))


def damage(stored, how: str) -> None:
    """Damage a stored checkpoint's file (see the module docstring)."""
    import io

    if how == "intact":
        return
    if how == "gone":
        stored.store.inner.remove(stored.name)
        return
    if how in ("planted", "foreign"):
        import json

        step = json.loads(stored.store.read(stored.name + ".json", lambda f: f.read()))["step"]
        if how == "foreign":
            body = _foreign_body(step)
        else:
            import torch

            buffer = io.BytesIO()
            torch.save({"step": step, "model": Planted(planted_command())}, buffer)
            body = buffer.getvalue()
        _replace_with_matching_manifest(stored, body)
        return
    body = stored.store.read(stored.name, lambda f: f.read())
    damaged = {
        "truncated": body[: len(body) // 3],
        "emptied": b"",
        "garbled": body[:500] + bytes(b ^ 0xFF for b in body[500:600]) + body[600:],
    }
    stored.store.inner.write(stored.name, io.BytesIO(damaged[how]))


def _damage_at_checkpoint(how: str, n: int) -> None:
    from scalertune._storage._checkpoints import StoredCheckpoint

    publish = StoredCheckpoint.publish
    count = 0

    def published(self, path, step, written=None):
        nonlocal count
        publish(self, path, step, written)
        count += 1
        if count == n:
            damage(self, how)
            os.kill(os.getpid(), signal.SIGKILL)

    StoredCheckpoint.publish = published


def _lose_after_reference(how: str) -> None:
    from scalertune._search import _references
    from scalertune._storage._checkpoints import StoredCheckpoint

    add = _references.add_reference

    def added(study, record, config, times, *, checkpoints, **kwargs):
        add(study, record, config, times, checkpoints=checkpoints, **kwargs)
        if checkpoints:
            from scalertune._storage._store import Store, location_of

            store = Store(location_of(study))
            for name in checkpoints.values():
                damage(StoredCheckpoint(store, name), how)

    _references.add_reference = added


def _limit_file_size(size: int) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "checkpoint":
        _damage_at_checkpoint(sys.argv[2], int(sys.argv[3]))
        rest = sys.argv[4:]
    elif mode == "lose":
        _lose_after_reference(sys.argv[2])
        rest = sys.argv[3:]
    elif mode == "outage":
        from scalertune._storage import _policy as _storage_policy

        _storage_policy.STORAGE_OUTAGE_S = float(sys.argv[2])
        rest = sys.argv[3:]
    elif mode == "fsize":
        _limit_file_size(int(sys.argv[2]))
        rest = sys.argv[3:]
    else:
        _arm(getattr(signal, "SIG" + mode), int(sys.argv[2]))
        rest = sys.argv[3:]
    from scalertune.cli import program

    # The executable's own entry point: once the command has its exit status, a late Ctrl-C
    # cannot change it (cli.main returns to a caller that may still be interrupted, and a
    # second SIGINT in the moment before sys.exit killed this launcher with -2).
    sys.argv = ["scalertune", *rest]
    program()
