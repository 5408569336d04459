"""``python -m experiments.trace_replay``: the command line (:func:`run.main`)."""

from experiments.trace_replay.run import main

if __name__ == "__main__":
    raise SystemExit(main())
