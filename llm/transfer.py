"""``python -m llm.transfer`` was retired: transfer is measured on the claims study's effects.

The claims study (``python -m llm.claims``) runs the rules on the same four rungs and writes, per
claim, the paired effect on each rung side by side (``transfer.csv``, :mod:`sandbox.study.transfer`);
every claims study writes it, and ``--profile gpu`` adds the llm rung. This command only says so:
its old flags and folders meant another study, and running that one under the old name would mix
two methods.
"""

from __future__ import annotations

import sys

from sandbox.configs import CommandParser

MESSAGE = (
    "error: python -m llm.transfer was retired; run python -m llm.claims (--profile gpu adds "
    "the llm rung; transfer per claim: transfer.csv in its --out folder, docs/claims.md)"
)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m llm.transfer", description=__doc__)
    parser.parse_known_args(argv)  # --help prints the above and exits 0
    print(MESSAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
