"""``python -m cs_run``: the ``cs-run`` command, for a Python whose scripts folder is not on PATH."""

from cs_run.frontends.cli import main

if __name__ == "__main__":
    main()
