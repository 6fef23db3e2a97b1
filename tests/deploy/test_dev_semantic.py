"""`prism dev` offline with the semantic extra installed: a project whose policy turns the
semantic cache on gets a paraphrase answered from it (the model comes from its PyPI
package; nothing is downloaded)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from deploy.local.ports import free_port
from tests.fixtures.stacks import (
    CLI_START,
    PRISM,
    STACK_START,
    STACK_STOP,
    STACK_TEST_TIMEOUT,
    prism_dev,
    read_line,
    stack_env,
)

pytest.importorskip("numpy", reason="the semantic extra is not installed")


@pytest.mark.timeout(STACK_TEST_TIMEOUT)
def test_prism_dev_offline_serves_a_semantic_hit(tmp_path: Path) -> None:
    env = stack_env("PRISM_SEMANTIC_MODEL")
    # Offline: the hub libraries' switches, and any HTTP(S) client pointed at a dead proxy.
    dead = f"http://127.0.0.1:{free_port()}"
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env |= {"HTTP_PROXY": dead, "HTTPS_PROXY": dead, "NO_PROXY": "127.0.0.1,localhost"}
    dev = prism_dev(tmp_path / "state", env)
    try:
        info = json.loads(read_line(dev, timeout=STACK_START))
        policy = subprocess.run(
            [*PRISM, "policy", "set", "--project", info["project"], "--semantic", "--no-kv"],
            capture_output=True, text=True, timeout=CLI_START, env=env | {"REDIS_URL": info["redis_url"]},
        )  # fmt: skip
        assert policy.returncode == 0, policy.stdout + policy.stderr
        smoke = subprocess.run(
            [*PRISM, "smoke", info["edge_url"], "--key", info["api_key"], "--json",
             "--pause", "1.5", "--semantic"],
            capture_output=True, text=True, timeout=CLI_START, env=env,
        )  # fmt: skip
        rows = json.loads(smoke.stdout)
        assert smoke.returncode == 0, rows
        assert [row["layer"] for row in rows[3:]] == ["miss", "semantic"]
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(timeout=STACK_STOP)
    assert dev.returncode == 0
