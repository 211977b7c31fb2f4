"""Write ``tests/data/megatron_lm_arguments.tsv``: every ``--option`` that Megatron-LM's
``pretrain_gpt.py`` parses, whether it takes a value, and its choices, as Megatron-LM's own
``add_megatron_arguments`` builds its parser (many options come from config dataclasses, so the
parser is built, not read). The Megatron export's tests check every flag against the file: the
``megatron-core`` wheel has no ``megatron.training``, and CI reaches no GitHub.

    python tests/megatron_lm_arguments.py CHECKOUT COMMIT > tests/data/megatron_lm_arguments.tsv

(``CHECKOUT``: a tree of Megatron-LM at ``COMMIT``, e.g. ``git archive COMMIT megatron`` unpacked.)

Written from NVIDIA/Megatron-LM @ d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22) under
Python 3.11, whose ``typing`` lacks ``override`` (3.12), which that checkout imports: it is
stood in by the identity for the import.
"""

import argparse
import sys
import typing


def main(checkout: str, commit: str) -> None:
    typing.override = getattr(typing, "override", lambda f: f)
    sys.path.insert(0, checkout)
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    print(f"# Megatron-LM options of pretrain_gpt.py, NVIDIA/Megatron-LM @ {commit}; "
          "written by tests/megatron_lm_arguments.py")
    print("option\tvalues\tchoices")
    rows = set()
    for action in parser._actions:
        takes = "none" if action.nargs == 0 else str(action.nargs or 1)
        choices = ",".join(map(str, action.choices)) if action.choices else ""
        for option in action.option_strings:
            if option.startswith("--"):
                rows.add((option, takes, choices))
    for row in sorted(rows):
        print("\t".join(row))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
