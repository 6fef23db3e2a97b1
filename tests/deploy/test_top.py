"""`prism top` as a person uses it: `prism dev` running, traffic flowing, `prism top` in a
real terminal (tmux), the figures moving, then `q` (or Ctrl-C) and a clean exit; and
`--json` for scripts."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
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
from tests.polling import wait_for

ROOT = Path(__file__).parents[2]


# The module's stack starts in the first test's setup and stops in the last's teardown.
pytestmark = pytest.mark.timeout(STACK_TEST_TIMEOUT)


@dataclass
class DevStack:
    info: dict[str, str]
    state_dir: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    state = tmp_path_factory.mktemp("top") / "state"
    env = stack_env("PRISM_ADMIN_KEY")
    dev = prism_dev(state, env)
    try:
        info = json.loads(read_line(dev, timeout=STACK_START))
        yield DevStack(info, state, env)
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(timeout=STACK_STOP)


@pytest.fixture
def traffic(dev_stack: DevStack) -> Iterator[None]:
    """Requests straight at the origin, with the dev key, until the test ends: one miss,
    then Redis hits of it (KV hits at the edge would be invisible to the origin)."""
    stop = threading.Event()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "prism top"}]}

    def send() -> None:
        with httpx.Client(
            base_url=dev_stack.info["origin_url"],
            headers={"authorization": f"Bearer {dev_stack.info['api_key']}"},
            timeout=10,
        ) as client:
            while not stop.is_set():
                client.post("/v1/chat/completions", json=body)
                stop.wait(0.05)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    yield
    stop.set()
    sender.join(timeout=10)


def test_json_frame_shows_rates_providers_and_spend_today(
    dev_stack: DevStack, traffic: None
) -> None:
    def frame() -> dict[str, Any] | None:
        run = subprocess.run(
            [*PRISM, "top", "--json", "--interval", "0.5", "--state-dir", str(dev_stack.state_dir)],
            capture_output=True, text=True, timeout=CLI_START, env=dev_stack.env, cwd=ROOT,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        found: dict[str, Any] = json.loads(run.stdout)
        spend = found["spend"]["projects"]
        return found if found["requests"]["redis"]["per_second"] and spend else None

    found = wait_for(frame, timeout=CLI_START, interval=0.2)  # a `prism top` each try
    assert found["url"] == dev_stack.info["origin_admin_url"]
    assert found["requests"]["kv"]["total"] == 0  # the edge's hits, once its records come
    assert found["providers"]["openai"]["state"] == "healthy"
    assert found["spend"]["scope"] == "today"  # the dev stack's admin key was found
    assert found["spend"]["projects"]["dev"]["cost_usd"] > 0
    assert found["hit_ratio"] is not None and found["hit_ratio"] > 0.5


def test_an_origin_that_cannot_be_reached_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(
        [*PRISM, "top", "--once", "--url", url, "--interval", "0.2"],
        capture_output=True, text=True, timeout=CLI_START,
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip() == f"Error: cannot reach {url}/metrics: ConnectError"


@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_top_refreshes_in_a_real_terminal_and_quits_cleanly(
    dev_stack: DevStack, traffic: None, quit_key: str
) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: `make test` installs it with apt when root or sudo")
    socket = (
        f"prism-top-{os.getpid()}-{quit_key}"  # a private tmux server: never the user's sessions
    )
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    top = shlex.join([*PRISM, "top", "--interval", "0.5", "--state-dir", str(dev_stack.state_dir)])
    script = f'cd {shlex.quote(str(ROOT))} && {top}; echo "prism top exited $?"; sleep 60'
    # The terminal's own size, as a person's would be: pytest-xdist's workers set
    # COLUMNS/LINES (80x24), which would win over the pane's.
    env = {k: v for k, v in dev_stack.env.items() if k not in ("COLUMNS", "LINES")}
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "160", "-y", "50", "-s", "top", script],
        check=True, env=env, timeout=20,
    )  # fmt: skip

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10
        ).stdout

    redis_row = re.compile(r"│ redis\s+│\s+([\d.,]+) │\s+([\d,]+) │")

    last = [""]

    def moving() -> str | None:
        shown = last[0] = screen()
        row = redis_row.search(shown)
        busy = row is not None and float(row.group(1).replace(",", "")) > 0
        return shown if busy and "healthy" in shown and "dev " in shown else None

    try:
        try:
            shown = wait_for(moving, timeout=CLI_START, interval=0.25)  # its start-up
        except AssertionError:
            size = subprocess.run(
                [*tmux, "display-message", "-p", "-t", "top", "#{window_width}x#{window_height}"],
                capture_output=True, text=True, timeout=10,
            ).stdout  # fmt: skip
            raise AssertionError(
                f"prism top never showed the traffic; last screen ({size.strip()}):\n{last[0]}"
            ) from None
        assert "prism top " + dev_stack.info["origin_admin_url"] in shown
        assert "q to quit" in shown and "Spend today (UTC, every origin)" in shown
        assert "kv" in shown and "told to this origin" in shown  # the edge's hits, as told
        subprocess.run([*tmux, "send-keys", "-t", "top", quit_key], check=True, timeout=10)
        after = wait_for(lambda: "prism top exited" in screen() and screen(), timeout=15)
        assert "prism top exited 0" in after
        assert "Traceback" not in after
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
