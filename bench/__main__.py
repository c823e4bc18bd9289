"""``python3 -m bench [--quick]``: the one command.

Prepares the two virtualenvs and wrk (bench/envs.py), then runs the suite
(bench/suite.py) inside the app's bench venv. ``python3 -m bench listen``
runs the listen-stream bench (bench/listen.py) instead, which needs only the
app venv.
"""

from __future__ import annotations

import os
import sys

from bench import envs


def main() -> None:
    os.chdir(envs.REPO)
    if sys.argv[1:2] == ["listen"]:  # the listen-stream bench (bench/listen.py): mcptasks only
        envs.VENVS.mkdir(parents=True, exist_ok=True)
        envs.ensure_venv(envs.APP_VENV, envs.APP_REQUIREMENTS, envs.REPO / "requirements" / "bench.txt")
        argv = [str(envs.APP_PY), "-m", "bench.listen", *sys.argv[2:]]
        os.execv(argv[0], argv)
    envs.ensure_all()
    argv = [str(envs.APP_PY), "-m", "bench.suite", *sys.argv[1:]]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
