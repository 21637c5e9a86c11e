"""The τ study's tests: its scripts import each other by name from research/tau (as they do when run), and they
share the package tests' fixtures (``rng``, ``encoder``, the cache folder) and helpers (``blobs``)."""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "tau"))

_spec = importlib.util.spec_from_file_location("package_conftest", HERE.parents[2] / "tests" / "conftest.py")
package_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(package_conftest)
sys.modules["package_conftest"] = package_conftest
_cache_dir, encoder, rng, shared_data = (package_conftest._cache_dir, package_conftest.encoder, package_conftest.rng,
                                         package_conftest.shared_data)
blobs = package_conftest.blobs
