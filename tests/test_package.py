"""The package's own names: a short public surface, each name the object its subpackage exports, the
Loader loaded (with JAX) only when asked for, and one version, pyproject's."""

from __future__ import annotations

import importlib.metadata
import tomllib

import pytest

import pskd_jax
from pskd_jax import checkpoint, corpus, data, errors, pipeline
from pskd_jax import format as container
from tests.helpers import ENV, ROOT, run_python

SUBPACKAGES = (container, data, pipeline, corpus, checkpoint, errors)


def test_the_surface_is_short_and_sorted():
    assert 20 <= len(pskd_jax.__all__) <= 30
    assert pskd_jax.__all__ == sorted(pskd_jax.__all__)
    assert len(set(pskd_jax.__all__)) == len(pskd_jax.__all__)


def test_every_top_level_name_is_the_object_its_subpackage_exports():
    homes = {name: [p.__name__ for p in SUBPACKAGES if getattr(p, name, None) is getattr(pskd_jax, name)]
             for name in pskd_jax.__all__ if name != "Loader"}
    assert {name: found for name, found in homes.items() if len(found) != 1} == {}


def test_names_left_out_of_the_top_stay_in_their_subpackage():
    for package, name in ((container, "Header"), (container, "Layout"), (data, "export_json"), (data, "pack_file"),
                          (corpus, "build_shard"), (corpus, "read_manifest"), (checkpoint, "verify_file"),
                          (errors, "TruncatedError")):
        assert name in package.__all__ and not hasattr(pskd_jax, name), (package.__name__, name)


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'pskd_jax' has no attribute 'Lodaer'"):
        pskd_jax.Lodaer
    assert "Loader" in dir(pskd_jax)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_loader_is_imported_with_jax_only_when_asked_for():
    code = """
        import sys
        import pskd_jax
        before = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib") or m == "pskd_jax.loader")
        loader = pskd_jax.Loader
        import pskd_jax.loader
        print(before, loader is pskd_jax.loader.Loader, "jax" in sys.modules)
    """
    result = run_python(code, env=dict(ENV, JAX_PLATFORMS="cpu"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True", "True"]


def test_the_version_is_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project.get("dynamic", [])
    assert pskd_jax.__version__ == project["version"] == importlib.metadata.version("pskd_jax")
