"""The front ends: every way a user enters a run, above the runners (docs/architecture.md#layers).

``cli`` (the ``cs-run`` command; ``checkpoint_cli`` and ``plot`` are its ``checkpoint`` and ``plot`` groups),
``modelzoo`` (``cstorch.run``, a Model Zoo ``run.py``), ``trainer`` (``cstorch.Trainer``), ``options`` (every
command's flags) and ``compat`` (``cs-run exec``: a vendor script's imports). Nothing below imports them. This
file imports none of them, so loading one front end (``cs-run --help``) does not load the others.
"""
