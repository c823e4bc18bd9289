import os

from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
    verbose_name = "Benchmark fixtures"

    def ready(self) -> None:
        if os.environ.get("BENCH_COMMIT_LOG"):
            from . import commits

            commits.install()
