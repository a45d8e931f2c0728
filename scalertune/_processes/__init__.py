"""A job in processes of its own: one (``--isolate``), one per rank (``--nproc-per-node``),
or one per rank of the user's own launcher across hosts (``torchrun --nnodes``, ``srun``).

- ``_protocol``: what crosses to a job's processes and back: the form of a job, the replies
  every job shares (its result, a rank's part done, a failure), and the failures as the
  parent raises them;
- ``_start``: how the processes start: the forkserver, the environment torchrun gives a rank;
- ``_child``: a process's life: it dies with its parent, joins its ranks' group, does its job
  and sends back what came of it;
- ``_blame``: the rank a failed run is blamed on, and how a process died;
- ``_launcher``: :class:`Launch`, the parent's side of one job, and :func:`launch`, the one
  loop that receives a job's replies;
- ``_main_guard``: the ``if __name__ == "__main__":`` guard a script needs around a call that
  starts processes;
- ``_world``: the ranks the user's launcher (torchrun, srun) started this process among, and
  the environment of a rank's process for one run;
- ``_hosts``: :class:`Crew`, the launcher's ranks across hosts: rank 0 leads every job, the
  others run their part and report, and a host that stops answering ends the search;
- ``_policy``: the launcher's own policy number (how long a failed job's ranks have to
  report), with its reason.
"""
