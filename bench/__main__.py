"""``python3 -m bench [--quick]``: the one command.

Prepares the two virtualenvs and wrk (bench/envs.py), then runs the suite
(bench/suite.py) inside the app's bench venv.
"""

from __future__ import annotations

import os
import sys

from bench import envs


def main() -> None:
    os.chdir(envs.REPO)
    envs.ensure_all()
    argv = [str(envs.APP_PY), "-m", "bench.suite", *sys.argv[1:]]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
