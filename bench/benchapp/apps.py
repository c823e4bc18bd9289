import os

from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
    verbose_name = "Benchmark fixtures"

    def ready(self) -> None:
        if os.environ.get("BENCH_GC_FREEZE"):  # python3 -m bench listen --gc-freeze
            import gc

            gc.freeze()  # what is loaded by now is never scanned again by a full collection
        if os.environ.get("BENCH_COMMIT_LOG"):
            from . import commits

            commits.install()
