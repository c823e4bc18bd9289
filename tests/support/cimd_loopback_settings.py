"""The test site, fetching client metadata documents from loopback too
(tests/support/cimd_loopback.py); everything else as in tests.testapp.settings."""

from tests.testapp.settings import *  # noqa: F403
from tests.testapp.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.cimd_loopback.LoopbackDocumentsConfig"]
