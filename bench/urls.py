from django.urls import path
from project.urls import urlpatterns as project_urlpatterns

from bench.benchapp.views import bare, bare_async

urlpatterns = [
    *project_urlpatterns,
    path("bare", bare),
    path("bare-async", bare_async),
]
