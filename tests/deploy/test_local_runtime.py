"""The local Workers runtime over real HTTP: a Python Worker with packages in
workerd, the Workers KV REST stand-in sharing its namespace, and clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import cloudflare
import httpx
import pytest

from deploy.local.workers import (
    ExtraWorker,
    LocalWorkersRuntime,
    PortInUseError,
    RuntimeStartError,
    ToolchainNotFoundError,
    find_node_toolchain,
)
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory
from tests.polling import wait_for

SAMPLE = Path(__file__).parent / "sample_worker"
RUNTIME_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "runtime.mjs"
SECRET = "s3cr3t-value"


def group_alive(pgid: int) -> bool:
    """Whether any process (node or workerd, zombies included) is left in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def workerd_pids_in_group(pgid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-g", str(pgid), "-f", "workerd"], capture_output=True)
    return [int(p) for p in found.stdout.split()]


@pytest.fixture(scope="module")
def runtime(workers_runtime_factory: WorkersRuntimeFactory) -> Iterator[LocalWorkersRuntime]:
    rt = workers_runtime_factory(
        SAMPLE,
        {"SAMPLE_SECRET": SECRET},
        api_token="module-token",
        extra_workers=[
            ExtraWorker(
                "floor",
                SAMPLE / "js",
                entry="floor.js",
                vars={"GREETING": "hi"},
                kv_binding="PRISM_KV",
            )
        ],
    )
    yield rt
    rt.stop()


@pytest.fixture(scope="module")
def kv(runtime: LocalWorkersRuntime) -> Iterator[KVApi]:
    client = KVApi(runtime)
    yield client
    client.close()


@pytest.fixture
def edge(runtime: LocalWorkersRuntime) -> Iterator[httpx.Client]:
    assert runtime.edge_url is not None
    with httpx.Client(base_url=runtime.edge_url, timeout=10.0) as client:
        yield client


# ---------------------------------------------------------------- the Python Worker


def test_python_worker_resolves_package_imports(edge: httpx.Client) -> None:
    body = edge.get("/imports").json()
    assert body == {
        "thing": "THING:DEEP",  # relative imports inside the package
        "deep": "DEEP",  # parent-relative import from a subpackage
        "pkg_init": "THING/DEEP",  # `from pkg import thing` inside pkg/__init__.py
        "namespace_package": "namespace-ok",  # a folder without __init__.py
        "import_module": "DEEP",
        "thing_package": "pkg",
        "deep_name": "pkg.sub.deep",
        "pkg_file": "/session/metadata/pkg/__init__.py",
        "entry_name": "entry",
    }


def test_edge_reads_at_once_what_the_stand_in_bulk_wrote(edge: httpx.Client, kv: KVApi) -> None:
    value = f"written-{time.time_ns()}"
    assert kv.bulk_put({"shared/one": value}) == {
        "successful_key_count": 1,
        "unsuccessful_keys": [],
    }
    response = edge.get("/kv", params={"key": "shared/one"})
    assert response.status_code == 200
    assert response.json() == {"found": True, "value": value}


def test_edge_sees_string_bindings(edge: httpx.Client) -> None:
    assert edge.get("/env", params={"name": "SAMPLE_SECRET"}).json() == {"value": SECRET}


def test_wait_until_work_outlives_the_response(edge: httpx.Client, kv: KVApi) -> None:
    prefix = f"bg/{time.time_ns()}/"
    keys = [f"{prefix}{i}" for i in range(20)]
    for key in keys:
        assert edge.get("/bg", params={"key": key, "value": key.upper()}).status_code == 202
    wait_for(lambda: len(kv.list_keys(prefix)) == len(keys))
    assert all(kv.get_text(key) == key.upper() for key in keys)


def test_extra_javascript_worker_shares_the_namespace(
    runtime: LocalWorkersRuntime, kv: KVApi
) -> None:
    kv.bulk_put({"shared/floor": "from-api"})
    floor = runtime.extra_urls["floor"]
    assert httpx.get(floor).json() == {"worker": "floor-js", "greeting": "hi"}
    assert httpx.get(f"{floor}/kv", params={"key": "shared/floor"}).json() == {
        "found": True,
        "value": "from-api",
    }


def test_start_reports_urls_and_timings(runtime: LocalWorkersRuntime) -> None:
    assert runtime.kv_api_url is not None and runtime.kv_api_url.endswith("/client/v4")
    assert runtime.timings["runtime_ms"] > 0
    assert "edge" in runtime.timings["warmup_ms"]


# ---------------------------------------------------------------- the KV REST stand-in


def test_bulk_put_100_keys_then_get_each_value(kv: KVApi) -> None:
    pairs = {f"bulk/{i:03d}": f"value-{i}" for i in range(100)}
    assert kv.bulk_put(pairs) == {"successful_key_count": 100, "unsuccessful_keys": []}
    for key, value in pairs.items():
        assert kv.get_text(key) == value


def test_bulk_put_with_ttl_expires_the_key(kv: KVApi) -> None:
    kv.bulk_put([{"key": "expiring/kept", "value": "x", "expiration_ttl": 120}])
    listed = kv.http.get(f"{kv.namespace_url()}/keys", params={"prefix": "expiring/kept"}).json()
    [item] = listed["result"]
    assert item["expiration"] >= time.time() + 100


def test_values_endpoint_put_and_get_with_encoded_key(kv: KVApi) -> None:
    key = "odd key/with?chars&%"
    url = kv.value_url(key)
    assert kv.http.put(url, content=b"raw-bytes").json() == {
        "success": True,
        "errors": [],
        "messages": [],
        "result": {},
    }
    assert kv.get(key) == b"raw-bytes"
    missing = kv.http.get(kv.value_url(key + "-missing"))
    assert missing.status_code == 404
    assert missing.json()["errors"] == [{"code": 10009, "message": "key not found"}]


def test_keys_list_filters_by_prefix_and_pages_with_cursor(kv: KVApi) -> None:
    kv.bulk_put({f"page/{i:02d}": "v" for i in range(25)} | {"pagex": "other"})
    first = kv.http.get(
        f"{kv.namespace_url()}/keys", params={"prefix": "page/", "limit": 10}
    ).json()
    assert [k["name"] for k in first["result"]] == [f"page/{i:02d}" for i in range(10)]
    assert first["result_info"]["count"] == 10 and first["result_info"]["cursor"]
    assert kv.list_keys("page/") == [f"page/{i:02d}" for i in range(25)]
    too_small = kv.http.get(f"{kv.namespace_url()}/keys", params={"limit": 5})
    assert too_small.status_code == 400
    assert too_small.json()["errors"][0]["code"] == 10028


def test_bulk_delete_removes_keys(kv: KVApi) -> None:
    kv.bulk_put({"del/a": "1", "del/b": "2", "del/c": "3"})
    response = kv.http.post(f"{kv.namespace_url()}/bulk/delete", json=["del/a", "del/b"])
    assert response.json()["result"] == {"successful_key_count": 2, "unsuccessful_keys": []}
    assert kv.list_keys("del/") == ["del/c"]


def test_expiration_ttl_below_60_is_rejected_like_the_real_api(kv: KVApi) -> None:
    response = kv.http.put(
        f"{kv.namespace_url()}/bulk",
        json=[
            {"key": "ttl/ok", "value": "1"},
            {"key": "ttl/short", "value": "2", "expiration_ttl": 30},
        ],
    )
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {
            "code": 10034,
            "message": "Invalid expiration_ttl of 30. Expiration TTL must be at least 60.",
        }
    ]
    assert kv.list_keys("ttl/") == []  # validated before anything is written


def test_namespaces_list_create_and_isolation(kv: KVApi) -> None:
    title = f"created-{time.time_ns()}"
    created = kv.http.post(kv.namespaces_url(), json={"title": title}).json()["result"]
    assert created["title"] == title and created["supports_url_encoding"] is True
    listed = kv.http.get(kv.namespaces_url(), params={"per_page": 100}).json()
    assert {"id": kv.namespace_id, "title": "prism-cache", "supports_url_encoding": True} in listed[
        "result"
    ]
    assert created in listed["result"]
    duplicate = kv.http.post(kv.namespaces_url(), json={"title": title})
    assert (duplicate.status_code, duplicate.json()["errors"][0]["code"]) == (400, 10014)

    kv.bulk_put({"iso/key": "in-created"}, namespace_id=created["id"])
    assert kv.get_text("iso/key", namespace_id=created["id"]) == "in-created"
    assert kv.get("iso/key") is None  # the edge's namespace is untouched

    unknown = kv.http.get(kv.value_url("x", namespace_id="no-such-namespace"))
    assert unknown.status_code == 404
    assert unknown.json()["errors"] == [{"code": 10013, "message": "namespace not found"}]


def test_requests_without_the_right_token_are_refused(kv: KVApi) -> None:
    missing = httpx.get(kv.namespaces_url())
    wrong = httpx.get(kv.namespaces_url(), headers={"Authorization": "Bearer nope"})
    assert (missing.status_code, wrong.status_code) == (401, 403)
    for response in (missing, wrong):
        assert response.json() == {
            "success": False,
            "errors": [{"code": 10000, "message": "Authentication error"}],
            "messages": [],
            "result": None,
        }


def test_429_fault_with_retry_after_then_recovery(kv: KVApi) -> None:
    kv.reset_controls()
    kv.fail_next(429, count=2, retry_after=7, endpoints=["bulk_put"])
    url = f"{kv.namespace_url()}/bulk"
    body = [{"key": "fault/k", "value": "v"}]
    assert kv.get("fault/k") is None  # other endpoints are not affected
    for _ in range(2):
        failed = kv.http.put(url, json=body)
        assert failed.status_code == 429
        assert failed.headers["retry-after"] == "7"
        assert failed.json()["success"] is False
    assert kv.http.put(url, json=body).status_code == 200
    assert kv.get_text("fault/k") == "v"
    assert kv.stats()["faults_injected"] == 2


def test_5xx_fault_applies_to_any_endpoint(kv: KVApi) -> None:
    kv.reset_controls()
    kv.fail_next(503, count=1)
    assert kv.http.get(kv.namespaces_url()).status_code == 503
    assert kv.http.get(kv.namespaces_url()).status_code == 200


def test_stats_count_calls_and_keys_by_endpoint(kv: KVApi) -> None:
    kv.reset_controls()
    for batch in range(3):
        kv.bulk_put({f"stats/{batch}/{i}": "v" for i in range(7)})
    kv.get("stats/0/0")
    httpx.get(kv.namespaces_url())  # an auth failure still counts as a call
    stats = kv.stats()
    assert stats["bulk_put_calls"] == 3
    assert stats["bulk_put_keys"] == 21
    assert stats["value_get_calls"] == 1
    assert stats["namespaces_list_calls"] == 1 and stats["auth_failures"] == 1
    assert stats["total_calls"] == 5
    kv.reset_controls()
    assert kv.stats() == {"total_calls": 0}


def test_official_cloudflare_sdk_works_against_the_stand_in(kv: KVApi) -> None:
    client = cloudflare.Cloudflare(api_token=kv.api_token, base_url=kv.url, max_retries=0)
    namespaces = client.kv.namespaces
    result = namespaces.bulk_update(
        kv.namespace_id, account_id=kv.account_id, body=[{"key": "sdk/a", "value": "A"}]
    )
    assert result is not None and result.successful_key_count == 1
    value = namespaces.values.get("sdk/a", account_id=kv.account_id, namespace_id=kv.namespace_id)
    assert value.text() == "A"
    keys = namespaces.keys.list(kv.namespace_id, account_id=kv.account_id, prefix="sdk/")
    assert [k.name for k in keys] == ["sdk/a"]
    # Auto-pagination must terminate: pages past the end are empty.
    titles = [ns.title for ns in namespaces.list(account_id=kv.account_id)]
    assert "prism-cache" in titles


def test_kv_api_fixture_runs_a_stand_in_of_its_own(kv_api_reset: KVApi, kv: KVApi) -> None:
    assert kv_api_reset.url != kv.url and kv_api_reset.runtime.edge_url is None
    kv_api_reset.bulk_put({"fixture/k": "v"})
    assert kv_api_reset.get_text("fixture/k") == "v"
    assert kv_api_reset.stats()["bulk_put_keys"] == 1


# ---------------------------------------------------------------- lifecycle


def test_stop_leaves_no_process_and_data_survives_restart(tmp_path: Path) -> None:
    persist = tmp_path / "kv"
    first = LocalWorkersRuntime(edge_root=None, edge_vars={}, persist_dir=persist).start()
    pgid = first.pid
    assert pgid is not None and workerd_pids_in_group(pgid)
    KVApi(first).bulk_put({"persisted": "yes"})
    first.stop()
    wait_for(lambda: not group_alive(pgid))
    assert workerd_pids_in_group(pgid) == []

    with LocalWorkersRuntime(edge_root=None, edge_vars={}, persist_dir=persist) as second:
        assert KVApi(second).get_text("persisted") == "yes"


def test_launcher_exits_cleanly_when_its_stdin_closes(tmp_path: Path) -> None:
    config = tmp_path / "runtime.json"
    config.write_text(
        json.dumps(
            {
                "edge": None,
                "kv_api": {"port": 0, "api_token": ""},
                "persist_dir": str(tmp_path / "kv"),
                "node_modules": str(find_node_toolchain().node_modules),
            }
        )
    )
    proc = subprocess.Popen(
        [str(find_node_toolchain().node), str(RUNTIME_SCRIPT), str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] is True and ready["edge"] is None
        assert (
            httpx.get(f"{ready['kv_api']}/accounts/local/storage/kv/namespaces").status_code == 200
        )
        proc.stdin.close()  # what happens when the parent dies
        assert proc.wait(timeout=10) == 0
        wait_for(lambda: not group_alive(proc.pid))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runtime = LocalWorkersRuntime(
            edge_root=None, edge_vars={}, persist_dir=tmp_path, kv_api_port=port
        )
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 .* is in use"):
            runtime.start()
    assert not runtime.running


def test_import_error_in_the_worker_fails_start_with_the_traceback(tmp_path: Path) -> None:
    root = tmp_path / "broken"
    root.mkdir()
    (root / "entry.py").write_text(
        "from js import Response\nimport no_such_module\n\n"
        "async def on_fetch(request, env, ctx):\n    return Response.new('x')\n"
    )
    runtime = LocalWorkersRuntime(
        edge_root=root, edge_vars={}, persist_dir=tmp_path / "kv", kv_api=False
    )
    with pytest.raises(RuntimeStartError) as raised:
        runtime.start()
    assert "No module named 'no_such_module'" in str(raised.value)
    assert not runtime.running


def test_missing_node_modules_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ToolchainNotFoundError, match="npm ci"):
        find_node_toolchain(tmp_path)
