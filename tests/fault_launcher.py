"""Run the scalertune command line and hit it with a signal from inside a storage write.

    python fault_launcher.py SIGNAL N ARGS...

sends SIGNAL (INT, TERM or KILL) to this very process at the N-th moment inside a storage
write. The moments are, on SQLite and PostgreSQL, just before and just after each SQL statement
that changes a table, just before each commit and just after it; on a journal file, just
before and just after each append. A signal sent from outside lands there only by chance; this
lands there every time. Only the main thread's writes count (Optuna's heartbeat thread writes
on its own).
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


if __name__ == "__main__":
    _arm(getattr(signal, "SIG" + sys.argv[1]), int(sys.argv[2]))
    from scalertune.cli import program

    # The executable's own entry point: once the command has its exit status, a late Ctrl-C
    # cannot change it (cli.main returns to a caller that may still be interrupted, and a
    # second SIGINT in the moment before sys.exit killed this launcher with -2).
    sys.argv = ["scalertune", *sys.argv[3:]]
    program()
