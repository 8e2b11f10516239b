"""``python -m cs_run.frontends.compat script.py [args]``: run a vendor script with its imports resolved to cs-run."""

from cs_run.frontends.compat import main

if __name__ == "__main__":
    main()
