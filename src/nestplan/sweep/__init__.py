"""Sweeps: a grid of searches described by one TOML file (``nestplan sweep SWEEP.toml``).

* ``spec``: strict loading of the sweep file into a frozen ``SweepSpec`` and its expansion into
  points, each with a stable id (a short hash of its parameters);
* ``run``: execution (in this process, a local process pool, or Ray tasks), progress, the CSV
  written row by row and resumed on a re-run, and the optional Parquet copy;
* ``plot``: the summary SVG (tokens/s per GPU against the GPU count);
* ``command``: the ``sweep`` subcommand.

Nothing here is imported by ``import nestplan``; Ray and pyarrow are imported only when asked for.
"""
