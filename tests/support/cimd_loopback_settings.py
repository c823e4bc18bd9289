"""The example site, fetching client metadata documents from loopback too
(tests/support/cimd_loopback.py); everything else as in project.settings."""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.cimd_loopback.LoopbackDocumentsConfig"]
