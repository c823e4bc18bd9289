"""A newcomer adopts mcptasks: the README's "Adding mcptasks to a site", to the letter.

The wheel is built from this checkout and installed, with the extras the
README names, into a virtualenv of its own next to a site fresh from
``django-admin startproject``. The site gets Celery the way Celery's "First
steps with Django" wires it, then the README's edits, one tool in an app of
its own with its test (``mcptasks.testing``, run by ``manage.py test``),
``migrate``, a user with a token, and ``manage.py mcptasks run`` with
no environment beyond what any shell has. The official ``mcp`` SDK then drives
a task of that tool to ``completed``.

Three times: on the services the README's production block names (Postgres, a
Redis broker, the Redis channel layer) with the default prefork pool and with
``--pool threads``, and on its development block (the startproject SQLite
database, the in-process ``memory://`` broker and the in-memory channel layer).
Each time the admin's stylesheet is served (WhiteNoise, as the README sets it
up) and the run's span reaches an OTLP receiver (the README's telemetry step).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from mcptasks.client import CreateTaskResult, DetailedTask, TasksExtension
from tests.support import live, postgres_only
from tests.support.waiting import wait_until
from tests.test_live_telemetry import otlp_receiver

README = live.REPO / "README.md"

# ==================================================================================================
# The README's "Adding mcptasks to a site", step by step. The README section and this block must
# change together: test_the_readme_section_shows_these_steps checks that every piece below
# appears in it word for word (with the site named "mysite", as in the README).
# ==================================================================================================

SITE = "mysite"
#: Where the README says "path/to/mcptasks", the test puts its copy of this checkout.
CHECKOUT_PLACEHOLDER = "path/to/mcptasks"
PIP_BUILD = "pip wheel --no-deps --wheel-dir dist path/to/mcptasks"
PIP_INSTALL = 'pip install "$(echo dist/mcptasks-*.whl)[postgres,redis,server,otel]"'

# Celery's "First steps with Django".
CELERY_PY = """\
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

app = Celery("mysite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""
PACKAGE_INIT = """\
from .celery import app as celery_app

__all__ = ("celery_app",)
"""

# Appended to mysite/settings.py.
SETTINGS = """\
INSTALLED_APPS += ["rest_framework", "rest_framework.authtoken", "mcptasks"]

from mcptasks import BEAT_SCHEDULE

MCPTASKS = {
    "AUTHENTICATION_CLASSES": ["mcptasks.web.identity.BearerTokenAuthentication"],
    "ALLOW_ANONYMOUS": False,
}
CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE}
CELERY_DB_REUSE_MAX = 1000
"""
# Then one of these two (the second with the site's own names).
DEVELOPMENT_SERVICES = """\
CELERY_BROKER_URL = "memory://"
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
"""
PRODUCTION_SERVICES = """\
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "mysite",
        "HOST": "127.0.0.1",
        "USER": "postgres",
    }
}
CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:6379/1"]},
    }
}
"""

# Static files with WhiteNoise: appended to mysite/settings.py, then collected.
STATIC_SETTINGS = """\
STATIC_ROOT = BASE_DIR / "staticfiles"
MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")
"""
COLLECTSTATIC = "python manage.py collectstatic --noinput"

# mysite/urls.py: one more entry in urlpatterns, and include() imported.
URLS_IMPORT = "from django.urls import include, path"
URLS_ENTRY = 'path("mcp", include("mcptasks.urls")),'

# mysite/asgi.py: its last line, `application = get_asgi_application()`, becomes these.
ASGI = """\
from mcptasks import mcp_router

application = mcp_router(get_asgi_application(), path="/mcp")
"""

# A tool in an app of the site's own (`python manage.py startapp reports`, listed in INSTALLED_APPS).
TOOL_APP = "reports"
TOOL_APP_SETTINGS = 'INSTALLED_APPS += ["reports"]'
TOOL = """\
from mcptasks import ToolContext, tool


@tool(task="required", description="Build a report, slowly.")
def build_report(ctx: ToolContext, title: str) -> str:
    ctx.report_status("building")
    ctx.sleep(0.5)
    return f"report {title!r} is ready"
"""

# The tool's test (reports/tests.py), run with Django's test runner.
TOOL_TEST = """\
from django.test import TransactionTestCase

from mcptasks.testing import call_tool


class BuildReportTests(TransactionTestCase):
    def test_build_report(self):
        call = call_tool("build_report", {"title": "Q3"})
        self.assertEqual(call.status, "completed")
        self.assertEqual(call.text, "report 'Q3' is ready")
"""
TOOL_TEST_RUN = "python manage.py test reports"
# Traces and metrics for every pool and beat: mysite/telemetry.py (from docs/observability.md),
# then the end of mysite/celery.py and of mysite/asgi.py.
OBSERVABILITY = live.REPO / "docs" / "observability.md"
TELEMETRY_PY = """\
import os
import threading

_lock = threading.Lock()
_configured = False


def configure() -> None:
    \"\"\"The OpenTelemetry SDK, once per process, when an OTLP endpoint is named.\"\"\"
    global _configured
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    with _lock:
        if _configured:
            return
        _configured = True
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]))
"""
CELERY_TELEMETRY = """\
from celery.signals import beat_init, worker_init, worker_process_init

from mysite import telemetry


@worker_init.connect
def telemetry_in_worker(sender=None, **kwargs):
    if "prefork" not in str(getattr(sender, "pool_cls", "")):
        telemetry.configure()


@worker_process_init.connect
def telemetry_in_pool_process(**kwargs):
    telemetry.configure()


@beat_init.connect
def telemetry_in_beat(**kwargs):
    telemetry.configure()
"""
ASGI_TELEMETRY = """\
from mysite import telemetry

telemetry.configure()
"""

# Then, in the site's folder.
MIGRATE = "python manage.py migrate"
CREATE_USER = "python manage.py createsuperuser"
CREATE_TOKEN = "python manage.py drf_create_token"
RUN = "python manage.py mcptasks run"

# ==================================================================================================


def readme_section() -> str:
    """The section, its numbered steps' indentation (three spaces) taken off."""
    text = README.read_text()
    start = text.index("## Adding mcptasks to a site")
    end = text.index("\n## ", start + 1)
    return "\n".join(line.removeprefix("   ") for line in text[start:end].splitlines())


def test_the_readme_section_shows_these_steps():
    """Not live: the README's text and the steps this test follows are the same."""
    section = readme_section()
    for piece in (
        PIP_BUILD,
        PIP_INSTALL,
        CELERY_PY,
        PACKAGE_INIT,
        SETTINGS,
        DEVELOPMENT_SERVICES,
        PRODUCTION_SERVICES,
        URLS_IMPORT,
        URLS_ENTRY,
        ASGI,
        TOOL_APP_SETTINGS,
        f"python manage.py startapp {TOOL_APP}",
        TOOL,
        TOOL_TEST,
        TOOL_TEST_RUN,
        MIGRATE,
        CREATE_USER,
        CREATE_TOKEN,
        RUN,
        STATIC_SETTINGS,
        COLLECTSTATIC,
        CELERY_TELEMETRY,
        ASGI_TELEMETRY,
    ):
        assert piece in section, f"the README's 'Adding mcptasks to a site' no longer shows:\n{piece}"
    assert TELEMETRY_PY in OBSERVABILITY.read_text(), "docs/observability.md no longer shows mysite/telemetry.py"


# The newcomer's machine ----------------------------------------------------------------------------

#: What any shell has; nothing that names the site, its settings or its services.
SHELL_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")


def shell_env(venv: Path) -> dict[str, str]:
    env = {name: os.environ[name] for name in SHELL_VARIABLES if name in os.environ}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def pip_env() -> dict[str, str]:
    # pip's own configuration (its index, its cache) stays; the test run's Python does not.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")}


def sh(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Newcomer:
    venv: Path
    wheel: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


@pytest.fixture(scope="session")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Newcomer:
    """The wheel built from this checkout, installed with the README's extras
    into a virtualenv of its own (one for both cases)."""
    work = tmp_path_factory.mktemp("adoption")
    source = work / "source"
    # A copy, so that the build leaves nothing in the checkout.
    shutil.copytree(
        live.REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "var", "node_modules", "__pycache__", "*.egg-info", "build", ".*_cache", "artifacts"
        ),
    )
    venv = work / "venv"
    sh([sys.executable, "-m", "venv", str(venv)], cwd=work, env=pip_env())
    # The README's two lines, in a shell of the new venv, from the folder that will hold dist/.
    env = {**pip_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    for line in (PIP_BUILD.replace(CHECKOUT_PLACEHOLDER, shlex.quote(str(source))), PIP_INSTALL):
        sh(["bash", "-c", f"{line} --quiet --disable-pip-version-check"], cwd=work, env=env)
    (wheel,) = (work / "dist").glob("mcptasks-*.whl")
    return Newcomer(venv=venv, wheel=wheel)


@dataclass(frozen=True)
class Services:
    settings: str
    database: str | None = None
    #: Redis servers this site wrote to, and the marker in its keys there.
    redis_urls: tuple[str, ...] = ()
    redis_marker: str = ""

    def clean_redis(self) -> None:
        import redis

        for url in self.redis_urls:
            with redis.Redis.from_url(url) as client:
                keys = list(client.scan_iter(match=f"*{self.redis_marker}*", count=1000))
                if keys:
                    client.delete(*keys)


def production_services(unique: str) -> Services:
    """The README's production block, with names of this run's own: its own
    database, and on the shared Redis its own queue and channel prefix."""
    base = os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL)
    redis = os.environ.get("MCPTASKS_TEST_REDIS_URL", live.DEFAULT_REDIS_URL)
    layer = f"{redis.rpartition('/')[0]}/1"  # the README's layer: database 1 of the same Redis
    database = f"mcptasks_adoption_{unique}"
    parts = httpx.URL(base)
    marker = f"mcptasks-adoption-{unique}"
    text = (
        PRODUCTION_SERVICES.replace('"NAME": "mysite"', f'"NAME": "{database}"')
        .replace('"HOST": "127.0.0.1"', f'"HOST": "{parts.host}", "PORT": "{parts.port or 5432}"')
        .replace('"USER": "postgres"', f'"USER": "{parts.username or "postgres"}"')
        .replace("redis://127.0.0.1:6379/0", redis)
        .replace('"hosts": ["redis://127.0.0.1:6379/1"]', f'"hosts": ["{layer}"], "prefix": "{marker}"')
    )
    # Not the README's: other runs share this Redis, so this site keeps to a queue of its own.
    text += f'CELERY_TASK_DEFAULT_QUEUE = "{marker}"\n'
    return Services(settings=text, database=database, redis_urls=(redis, layer), redis_marker=marker)


def follow_the_readme(site: Path, services: str, env: dict[str, str], python: str) -> None:
    """The README's steps on a site fresh from startproject."""
    package = site / SITE
    (package / "celery.py").write_text(CELERY_PY)
    (package / "__init__.py").write_text(PACKAGE_INIT)

    settings = package / "settings.py"
    settings.write_text(f"{settings.read_text()}\n{SETTINGS}\n{services}")

    urls = package / "urls.py"
    text = urls.read_text()
    assert "from django.urls import path" in text and "urlpatterns = [\n" in text, text
    text = text.replace("from django.urls import path", URLS_IMPORT)
    urls.write_text(text.replace("urlpatterns = [\n", f"urlpatterns = [\n    {URLS_ENTRY}\n"))

    asgi = package / "asgi.py"
    text = asgi.read_text()
    assert text.rstrip().endswith("application = get_asgi_application()"), text
    asgi.write_text(text.rstrip().removesuffix("application = get_asgi_application()") + ASGI)

    sh([python, "manage.py", "startapp", TOOL_APP], cwd=site, env=env)
    settings.write_text(f"{settings.read_text()}\n{TOOL_APP_SETTINGS}\n")
    (site / TOOL_APP / "mcp_tools.py").write_text(TOOL)
    (site / TOOL_APP / "tests.py").write_text(TOOL_TEST)

    # Static files, and telemetry for every pool.
    settings.write_text(f"{settings.read_text()}\n{STATIC_SETTINGS}")
    (package / "telemetry.py").write_text(TELEMETRY_PY)
    celery_py = package / "celery.py"
    celery_py.write_text(f"{celery_py.read_text()}\n{CELERY_TELEMETRY}")
    asgi.write_text(f"{asgi.read_text()}\n{ASGI_TELEMETRY}")


@dataclass(frozen=True)
class RunningSite:
    url: str
    token: str
    log: Path


@contextlib.contextmanager
def adopted_site(
    newcomer: Newcomer, work: Path, services: Services, *, pool: str = "prefork", otlp: str = ""
) -> Iterator[RunningSite]:
    env = shell_env(newcomer.venv)
    work.mkdir()
    sh([str(newcomer.venv / "bin" / "django-admin"), "startproject", SITE, str(work)], cwd=work, env=env)
    follow_the_readme(work, services.settings, env, newcomer.python)
    base = os.environ.get("DATABASE_URL", live.DEFAULT_DATABASE_URL)
    if services.database:
        live.create_database(base, services.database)  # `createdb`, as for any Postgres site
    proc = None
    try:
        tested = subprocess.run(
            [newcomer.python, *TOOL_TEST_RUN.split()[1:], "--noinput"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        assert tested.returncode == 0 and "Ran 1 test" in tested.stderr, f"{tested.stdout}\n{tested.stderr}"
        sh([newcomer.python, "manage.py", "migrate", "--noinput"], cwd=work, env=env)
        sh([newcomer.python, *COLLECTSTATIC.split()[1:]], cwd=work, env=env)
        sh(
            [
                newcomer.python,
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--username",
                "ada",
                "--email",
                "ada@example.com",
            ],
            cwd=work,
            env=env,
        )
        made = sh([newcomer.python, "manage.py", "drf_create_token", "ada"], cwd=work, env=env)
        token = re.search(r"Generated token (\w+) for user ada", made)
        assert token, made
        port = live.free_port()
        log = work / "run.log"
        # The standard OTLP variables, exporting soon so that the test need not wait.
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": SITE, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        run = [newcomer.python, "manage.py", "mcptasks", "run", "--port", str(port), "--concurrency", "2"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*run, "--pool", pool],
                cwd=work,
                env={**env, **otel} if otlp else env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}/mcp"
        # Any answer will do: the site is serving.
        live.wait_ready(
            proc, log, lambda: httpx.get(url, timeout=2).status_code, range(100, 600), what="mcptasks run", interval=0.2
        )
        yield RunningSite(url=url, token=token.group(1), log=log)
        os.killpg(proc.pid, live.signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=20) in (0, -live.signal.SIGTERM), live.tail(log)
    finally:
        if proc is not None:
            live.kill_group(proc)
        if services.database:
            live.drop_database(base, services.database)
        services.clean_redis()


def drive_a_task(
    site: RunningSite,
) -> tuple[types.CallToolResult, list[CreateTaskResult], list[DetailedTask], set[str]]:
    created: list[CreateTaskResult] = []
    states: list[DetailedTask] = []
    tasks = TasksExtension(timeout=30, on_created=created.append, on_status=states.append)

    async def main() -> tuple[types.CallToolResult, set[str]]:
        headers = {"Authorization": f"Bearer {site.token}"}
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(site.url, http_client=http)
            async with Client(transport, extensions=[tasks]) as client:
                listed = await client.list_tools()
                result = await client.call_tool("build_report", {"title": "Q3"})
                return result, {t.name for t in listed.tools}

    result, names = anyio.run(main)
    return result, created, states, names


@pytest.mark.live
@postgres_only.BOTH_SETUPS_ALREADY
@pytest.mark.parametrize("case", ["postgres-redis", "postgres-redis-threads", "embedded"])
def test_a_startproject_site_follows_the_readme_and_serves_a_task(newcomer: Newcomer, tmp_path: Path, case: str):
    unique = uuid.uuid4().hex[:10]
    services = production_services(unique) if case.startswith("postgres-redis") else Services(DEVELOPMENT_SERVICES)
    pool = "threads" if case.endswith("threads") else "prefork"
    with (
        otlp_receiver() as (received, otlp),
        adopted_site(newcomer, tmp_path / "site", services, pool=pool, otlp=otlp) as site,
    ):
        try:
            result, created, states, names = drive_a_task(site)
        except Exception as exc:
            raise AssertionError(f"the MCP client failed; the site's log:\n{live.tail(site.log)}") from exc
        admin_css = styled_admin(site)
        # The run is traced from the process that ran it, whichever the pool.
        run_spans = wait_until(
            lambda: received.named("execute_tool build_report"),
            timeout=60,
            explain=lambda: f"{received.spans}\n{live.tail(site.log)}",
        )
        startup = site.log.read_text()
    assert run_spans[0].service == SITE
    assert run_spans[0].attributes["mcptasks.run.outcome"] == "completed"
    assert "--header-bg" in admin_css
    assert "build_report" in names
    assert not result.is_error, result
    assert [block.text for block in result.content if isinstance(block, types.TextContent)] == ["report 'Q3' is ready"]
    assert len(created) == 1, "the call became one task"
    assert states[-1].status == "completed"
    # The run found the site's own pieces, by the rules the README gives.
    assert f"ASGI application {SITE}.asgi:application (from the asgi module beside WSGI_APPLICATION" in startup
    assert f"Celery app {SITE} (from the package of the settings module {SITE}.settings)" in startup
    mode = {
        "postgres-redis": "celery worker (2 processes) and beat",
        "postgres-redis-threads": "celery worker (2 threads) and beat",
        "embedded": "embedded worker (2 threads)",
    }[case]
    assert mode in startup, startup
    assert "static files: served by the site (WhiteNoise middleware)" in startup, startup


def styled_admin(site: RunningSite) -> str:
    """The stylesheet the admin's login page links, as the site serves it."""
    base = site.url.removesuffix("/mcp")
    page = httpx.get(f"{base}/admin/login/", timeout=10)
    assert page.status_code == 200, page.text[:500]
    href = re.search(r'<link rel="stylesheet" href="([^"]*/admin/css/base\.css)">', page.text)
    assert href, page.text[:2000]
    css = httpx.get(f"{base}{href.group(1)}", timeout=10)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css"), css
    return css.text
