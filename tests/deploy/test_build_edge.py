"""`prism build edge`: the staged Worker holds only edge and core modules and passes wrangler."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app

WRANGLER = Path(__file__).parents[2] / "node_modules" / ".bin" / "wrangler"
runner = CliRunner()


def build(tmp_path: Path, target: str) -> tuple[Path, list[str]]:
    out = tmp_path / target
    result = runner.invoke(app, ["build", "edge", "--target", target, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)["files"]


def test_cloudflare_bundle_holds_only_edge_and_core_modules(tmp_path: Path) -> None:
    out, files = build(tmp_path, "cloudflare")
    assert "src/entry.py" in files and "wrangler.toml" in files and "pyproject.toml" in files
    modules = [f for f in files if f.endswith(".py") and f != "src/entry.py"]
    assert modules and all(f.startswith(("src/edge/", "src/prism/")) for f in modules)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted(files)
    entry = (out / "src" / "entry.py").read_text()
    assert "class Default(WorkerEntrypoint)" in entry and "request.js_object" in entry
    assert "dependencies = []" in (out / "pyproject.toml").read_text()
    assert "TARGET = 'cloudflare'" in (out / "src" / "edge" / "build_info.py").read_text()


def test_local_bundle_uses_the_global_handler(tmp_path: Path) -> None:
    out, files = build(tmp_path, "local")
    assert "pyproject.toml" not in files
    assert "async def on_fetch(request, env, ctx)" in (out / "src" / "entry.py").read_text()


@pytest.mark.skipif(not WRANGLER.exists(), reason="node_modules missing: run `npm ci`")
def test_cloudflare_bundle_passes_wrangler_dry_run(tmp_path: Path) -> None:
    out, files = build(tmp_path, "cloudflare")
    result = subprocess.run(
        [str(WRANGLER), "deploy", "--dry-run", "--outdir", str(tmp_path / "dist")],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "WRANGLER_SEND_METRICS": "false", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--dry-run: exiting now." in result.stdout
    bundled = sorted(
        str(p.relative_to(tmp_path / "dist")) for p in (tmp_path / "dist").rglob("*.py")
    )
    assert bundled == sorted(f.removeprefix("src/") for f in files if f.endswith(".py"))


def test_bad_target_and_foreign_folder_are_refused(tmp_path: Path) -> None:
    assert runner.invoke(app, ["build", "edge", "--target", "aws"]).exit_code == 2
    (tmp_path / "precious.txt").write_text("keep me")
    result = runner.invoke(app, ["build", "edge", "--out", str(tmp_path)])
    assert result.exit_code == 2 and (tmp_path / "precious.txt").exists()
