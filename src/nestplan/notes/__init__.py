"""What the command line says beside its results, by subject: ``scenario`` (before evaluating),
``plan`` (of an evaluated plan) and ``runs`` (of measured runs). Each function says its note
through ``errors.note`` when its case holds and nothing otherwise."""
