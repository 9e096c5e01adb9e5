"""Plugins as a third party ships them: installed from a package, enabled without editing a list,
configured from their own `[plugins.<name>]` table; one that fails to start is left out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PY, call, inproc, make_settings, ok, probe, run_cli, text_of, write_config

from gateway.pipeline import PluginError
from gateway.proxy.server import Gateway

pytestmark = pytest.mark.anyio
TINY = Path(__file__).parent / "tiny_plugin"


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny_plugin installed with pip into a folder of its own, put on sys.path like site-packages."""
    work = tmp_path_factory.mktemp("tiny")
    source = shutil.copytree(TINY, work / "src")
    site = work / "site"
    subprocess.run(
        [PY, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(source)],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))
    for name in [m for m in sys.modules if m.startswith("tiny_plugin")]:
        del sys.modules[name]


async def test_installed_plugin_loads_gets_its_settings_and_runs_its_hooks(tmp_path: Path, tiny_site: Path) -> None:
    settings = make_settings(
        tmp_path, {"p": probe("p")}, plugin_settings={"tiny": {"greeting": "안녕하세요"}}, plugins=None
    )
    async with inproc(settings) as (gateway, session):
        names = {t.name for t in (await session.list_tools()).tools}
        assert "tiny_hello" in names and "response_outline" in names  # third-party beside the built-ins
        assert "broken_tool" not in names  # its plugin failed to start: left out, tools and all
        assert "broken on purpose" in gateway.pipeline.failed["tiny_broken"]
        assert text_of(await call(session, "p__echo", {"text": "x"})) == "x"
        hello = await ok(session, "tiny_hello")
        assert hello == {"greeting": "안녕하세요", "upstream_results_seen": ["p__echo"]}
        order = [p.name for p in gateway.pipeline.plugins]
        assert order.index("offload") < order.index("tiny") < order.index("monitor")


async def test_disabled_plugins_and_bad_plugin_settings(tmp_path: Path, tiny_site: Path) -> None:
    settings = make_settings(tmp_path, {}, plugins=None, disabled_plugins=["tiny_broken", "memory"])
    async with inproc(settings) as (gateway, session):
        names = {t.name for t in (await session.list_tools()).tools}
        assert "tiny_hello" in names and "context_append" not in names and not gateway.pipeline.failed
    bad = make_settings(tmp_path, {}, plugin_settings={"tiny": {"greting": "typo"}}, plugins=["tiny"])
    with pytest.raises(PluginError, match=r"\[plugins\.tiny\]:\n  greting: Extra inputs"):
        Gateway(bad)


def test_inspect_reports_a_plugin_that_failed_to_start(tmp_path: Path, tiny_site: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload", "tiny_broken", "monitor"])
    result = run_cli("inspect", "--config", str(cfg), PYTHONPATH=str(tiny_site))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "plugin tiny_broken failed to start and is left out: RuntimeError: broken on purpose" in result.stdout
    assert "Traceback" not in result.stdout


def test_old_gateway_keys_still_work_with_one_deprecation_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.settings import load_settings

    cfg = write_config(tmp_path, {}, ingest_roots=["/srv/docs"], response_ttl_hours=5)
    settings = load_settings(cfg, environ={})
    assert settings.plugins == {"documents": {"ingest_roots": ["/srv/docs"]}, "offload": {"response_ttl_hours": 5}}
    moved = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(moved) == 2 and "move it to [plugins.documents] ingest_roots" in moved[0]
