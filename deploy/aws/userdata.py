"""Render the origin instance's cloud-init user-data (a bash script for Ubuntu 24.04 LTS).

The image is pinned: Ubuntu 24.04 LTS (its ``python3`` is 3.12, the Python the
release's lock is resolved for). The script only installs apt packages, writes
files and starts two independent units, so a failure shows in the journal of
the unit it belongs to:

- ``caddy.service`` (Ubuntu's package): HTTPS on 443. Until the origin answers,
  every request gets a 503 JSON error, never a closed port.
- ``prism-origin.service``: ``ExecStartPre=+prism-install`` fetches the release
  (wheel + ``requirements.txt``) from S3 with the instance role and installs it
  with ``pip install --require-hashes`` into ``/opt/prism/venv`` (skipped when
  that release is already installed); ``ExecStartPre=prism-fetch-env`` reads
  the secrets from SSM into ``/run/prism-origin/origin.env`` (mode 0600) at
  every start; then ``prism origin serve`` on 127.0.0.1 (the public port, which
  Caddy proxies, and the admin port 9090 with the detailed /healthz and /metrics,
  which stays on loopback for an agent on the instance or an SSM port forward). ``Restart=always``
  with no start limit: a failed first start is retried, and
  ``journalctl -u prism-origin`` says why it failed.

There is no SSH: reach the instance with Session Manager (the Ubuntu image
runs the SSM agent; the role carries ``AmazonSSMManagedInstanceCore``).

User-data is readable by anyone who can describe the instance, so it carries
only the region, bucket and object names, the parameter path and parameter
*names*, never a value.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

from deploy.release import RELEASE_DIR
from prism.routes import HEALTH_PATH

__all__ = [
    "ADMIN_PORT",
    "CADDY_HEALTH_INTERVAL",
    "CADDY_HEALTH_TIMEOUT",
    "ENV_FILE",
    "FILE_SECRETS",
    "HEALTH_HOST",
    "IMAGE",
    "ORIGIN_PORT",
    "VENV",
    "WATCHDOG_SECONDS",
    "ami_parameters",
    "render_caddyfile",
    "render_user_data",
]

ORIGIN_PORT = 8080
ADMIN_PORT = 9090
# systemd restarts an origin whose event loop has not run for this long (a hung process:
# its loop pings every half of it). Longer than any pause a healthy origin has.
WATCHDOG_SECONDS = 30
# Caddy asks the origin's /healthz this often and takes it out of the proxy when it does
# not answer in time (or answers a 503: its loop lags), back once it answers 200.
CADDY_HEALTH_INTERVAL, CADDY_HEALTH_TIMEOUT = "2s", "1s"
ENV_FILE = "/run/prism-origin/origin.env"
VENV = "/opt/prism/venv"
IMAGE = "ubuntu-24.04"
# The name the deployer's health check sends (SNI and Host) when it dials a new
# instance's own address, before the Elastic IP (and the domain) points at it.
HEALTH_HOST = "prism-origin.internal"
# Secrets whose value is a file's content: written next to the env file and
# the variable is pointed at that copy.
FILE_SECRETS: Mapping[str, str] = {"PRISM_PROVIDERS_FILE": "providers.toml"}

_AMI_PARAMETERS = {
    "amd64": "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
    "arm64": "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id",
}
_ARM_FAMILY = re.compile(r"^[a-z]+\d+g[a-z]*$")  # Graviton: t4g, m7g, c6gn, ...
_SAFE = re.compile(r"^[A-Za-z0-9_.:/@+=,\[\]-]*$")


class _Template(string.Template):
    # Bash is full of `$`; an unusual delimiter keeps the template readable.
    delimiter = "@@"


_FETCH_ENV = '''\
#!/usr/bin/python3
"""Fetch the origin's secrets from SSM into /run/prism-origin (mode 0600)."""
import os
import sys

import boto3

REGION = @@region_py
PARAMETER_PATH = @@path_py
REQUIRED = @@required_py
FILE_SECRETS = @@files_py
RUN_DIR = "/run/prism-origin"


def write_private(path, text):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def quote(value):
    # systemd EnvironmentFile double-quote escapes: \\\\ \\" \\$ \\`
    for ch in ("\\\\", '"', "$", "`"):
        value = value.replace(ch, "\\\\" + ch)
    return '"' + value + '"'


ssm = boto3.client("ssm", region_name=REGION)
env = {}
for page in ssm.get_paginator("get_parameters_by_path").paginate(
    Path=PARAMETER_PATH, Recursive=False, WithDecryption=True
):
    for param in page["Parameters"]:
        env[param["Name"].rsplit("/", 1)[1]] = param["Value"]
missing = [name for name in REQUIRED if name not in env]
if missing:
    sys.exit("prism-fetch-env: missing SSM parameters: " + ", ".join(missing))
for name, filename in FILE_SECRETS.items():
    if name in env:
        path = os.path.join(RUN_DIR, filename)
        write_private(path, env[name])
        env[name] = path
write_private(
    os.path.join(RUN_DIR, "origin.env"),
    "".join(f"{name}={quote(value)}\\n" for name, value in sorted(env.items())),
)
print(f"prism-fetch-env: loaded {len(env)} parameters from {PARAMETER_PATH}")
'''

_INSTALL = '''\
#!/usr/bin/python3
"""Install release @@release_py into the venv: S3 objects, then pip --require-hashes."""
import hashlib
import os
import shutil
import subprocess
import sys

REGION = @@region_py
BUCKET = @@bucket_py
PREFIX = @@prefix_py
RELEASE = @@release_py
FILES = @@files_py
RELEASE_DIR = @@release_dir_py
VENV = @@venv_py


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(folder):
    missing = [name for name in FILES if not os.path.isfile(os.path.join(folder, name))]
    if not missing:
        return
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    for name in missing:
        tmp = os.path.join(folder, name + ".part")
        s3.download_file(BUCKET, PREFIX + name, tmp)
        os.replace(tmp, os.path.join(folder, name))


def main():
    marker = os.path.join(VENV, "prism-release")
    if os.path.isfile(marker) and open(marker).read().strip() == RELEASE:
        print(f"prism-install: release {RELEASE} is installed")
        return
    folder = os.path.join(RELEASE_DIR, RELEASE)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fetch(folder)
    for name, digest in FILES.items():
        if sha256(os.path.join(folder, name)) != digest:
            os.remove(os.path.join(folder, name))
            sys.exit(f"prism-install: {name} does not match its hash; removed, retrying")
    # One instance runs one release (a new release is a new instance): start clean.
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    pip = [os.path.join(VENV, "bin", "python"), "-m", "pip", "--disable-pip-version-check"]
    requirements = os.path.join(folder, "requirements.txt")
    subprocess.run(
        [*pip, "install", "--no-input", "--require-hashes", "-r", requirements], check=True
    )
    subprocess.run([*pip, "check"], check=True)
    with open(marker, "w") as f:
        f.write(RELEASE + "\\n")
    print(f"prism-install: installed release {RELEASE} into {VENV}")


if __name__ == "__main__":
    main()
'''

_USER_DATA = _Template("""\
#!/bin/bash
# Prism origin bootstrap for Ubuntu 24.04 LTS, rendered by `prism deploy origin`.
# Release @@release; holds object and SSM parameter names only, never a secret.
# Why something is down: journalctl -u caddy -u prism-origin (via Session Manager).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# shellcheck source=/dev/null
. /etc/os-release
if [ "${ID:-}-${VERSION_ID:-}" != "ubuntu-24.04" ]; then
    echo "prism: this user-data is for Ubuntu 24.04 LTS, not ${PRETTY_NAME:-unknown}" >&2
    exit 1
fi

apt-get update
apt-get install -y --no-install-recommends \\
    ca-certificates caddy python3 python3-venv python3-boto3

# Caddy first and on its own: 443 answers (a 503 JSON) while the origin installs.
cat > /etc/caddy/Caddyfile <<'PRISM_EOF'
@@caddyfile
PRISM_EOF
systemctl enable caddy.service
systemctl restart caddy.service

id prism >/dev/null 2>&1 \\
    || useradd --system --home-dir /opt/prism --shell /usr/sbin/nologin prism
install -d -m 0755 /opt/prism /opt/prism/bin @@release_dir

cat > /opt/prism/bin/prism-install <<'PRISM_EOF'
@@install
PRISM_EOF
cat > /opt/prism/bin/prism-fetch-env <<'PRISM_EOF'
@@fetch_env
PRISM_EOF
chmod 0755 /opt/prism/bin/prism-install /opt/prism/bin/prism-fetch-env

cat > /etc/systemd/system/prism-origin.service <<'PRISM_EOF'
[Unit]
Description=Prism origin (OpenAI-compatible LLM gateway), release @@release
Wants=network-online.target
After=network-online.target
# Keep retrying: at first boot the instance role may not be usable for a while.
StartLimitIntervalSec=0

[Service]
User=prism
Group=prism
RuntimeDirectory=prism-origin
RuntimeDirectoryMode=0700
UMask=0077
# `+`: as root (it writes the venv); a no-op once this release is installed.
ExecStartPre=+/opt/prism/bin/prism-install
ExecStartPre=/opt/prism/bin/prism-fetch-env
# `-`: the file does not exist until ExecStartPre has written it.
EnvironmentFile=-@@env_file
Environment=PRISM_RELEASE=@@release
@@{log_env}ExecStart=@@venv/bin/prism origin serve --host 127.0.0.1 --port @@port \\
    --admin-host 127.0.0.1 --admin-port @@admin_port
# Ready once it serves (READY=1), then alive only while its event loop runs: the loop
# pings the watchdog, and a loop stuck for WatchdogSec gets the process restarted.
Type=notify
NotifyAccess=main
WatchdogSec=@@watchdog_sec
TimeoutStartSec=20min
Restart=always
RestartSec=5
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=yes

[Install]
WantedBy=multi-user.target
PRISM_EOF

systemctl daemon-reload
systemctl enable prism-origin.service
# --no-block: the first start installs the release; user-data is done once it is queued.
systemctl start --no-block prism-origin.service
""")


def ami_parameters(instance_type: str) -> tuple[str, ...]:
    """The SSM public parameter naming the current Ubuntu 24.04 AMI for ``instance_type``."""
    return (_AMI_PARAMETERS[architecture(instance_type)],)


def architecture(instance_type: str) -> str:
    """``arm64`` for Graviton families, else ``amd64``."""
    family = instance_type.split(".", 1)[0]
    return "arm64" if _ARM_FAMILY.match(family) else "amd64"


_UNAVAILABLE = (
    '{"error":{"message":"The origin is starting or unavailable; retry shortly.",'
    '"type":"server_error","param":null,"code":"origin_unavailable"}}'
)


def render_caddyfile(site: str, *, acme: bool, load_balanced: bool = False) -> str:
    """Caddyfile for ``site`` (a domain with a public certificate, or an IP with
    ``tls internal``) and for :data:`HEALTH_HOST` (the pre-traffic health check).

    ``load_balanced``: the instance is one of several behind a load balancer, which
    holds the public certificate (ACME cannot work there: its validation lands on any
    instance). Caddy serves ``tls internal`` and answers every Host, because the load
    balancer's health checks name the instance's private IP, not the site.
    """
    if load_balanced:
        tls = "\ttls internal\n"
    elif acme:
        # Port 80 stays closed, so only TLS-ALPN-01 (on 443) can answer ACME.
        tls = "\ttls {\n\t\tissuer acme {\n\t\t\tdisable_http_challenge\n\t\t}\n\t}\n"
    else:
        tls = "\ttls internal\n"
    # Clients dialling an IP send no SNI; default_sni picks the site's certificate.
    head = (
        f"{{\n\tdefault_sni {site}\n}}\n\n"
        "(origin) {\n"
        f"\treverse_proxy 127.0.0.1:{ORIGIN_PORT} {{\n"
        # Stream SSE chunks through as they arrive.
        "\t\tflush_interval -1\n"
        # An origin whose loop hangs (or lags: its /healthz is a 503) is taken out
        # until it answers again, before the watchdog restarts it: the proxy's own 503
        # then tells the edge to ask another region.
        f"\t\thealth_uri {HEALTH_PATH}\n"
        f"\t\thealth_interval {CADDY_HEALTH_INTERVAL}\n"
        f"\t\thealth_timeout {CADDY_HEALTH_TIMEOUT}\n"
        "\t}\n"
        # The origin is not up (installing, restarting): a JSON 503, not a bare 502.
        "\thandle_errors {\n"
        "\t\theader Content-Type application/json\n"
        f"\t\trespond `{_UNAVAILABLE}` 503\n"
        "\t}\n"
        "}\n\n"
    )
    if load_balanced:
        # One catch-all block: certificates for the two names, routes for any Host.
        return head + f"https://{site}, https://{HEALTH_HOST}, :443 {{\n{tls}\timport origin\n}}"
    return (
        head
        + f"https://{site} {{\n{tls}\timport origin\n}}\n\n"
        + f"https://{HEALTH_HOST} {{\n\ttls internal\n\timport origin\n}}"
    )


def render_user_data(
    *,
    region: str,
    parameter_path: str,
    required: tuple[str, ...],
    site: str,
    acme: bool,
    bucket: str,
    prefix: str,
    release: str,
    files: Mapping[str, str],
    load_balanced: bool = False,
    log_prefix: str | None = None,
) -> str:
    """The instance's user-data; every argument is a name or a hash, never a secret value.
    ``log_prefix``: where in ``bucket`` the origin writes its request log's files."""
    for label, value in (
        ("log prefix", log_prefix or ""),
        ("region", region),
        ("parameter path", parameter_path),
        ("site", site),
        ("bucket", bucket),
        ("prefix", prefix),
        ("release", release),
        *(("file name", name) for name in files),
    ):
        if not _SAFE.match(value):
            raise ValueError(f"unsafe {label} for user-data: {value!r}")
    fetch_env = _Template(_FETCH_ENV).substitute(
        region_py=repr(region),
        path_py=repr(parameter_path),
        required_py=repr(tuple(required)),
        files_py=repr(dict(FILE_SECRETS)),
    )
    release_dir = RELEASE_DIR
    install = _Template(_INSTALL).substitute(
        region_py=repr(region),
        bucket_py=repr(bucket),
        prefix_py=repr(prefix),
        release_py=repr(release),
        files_py=repr(dict(files)),
        release_dir_py=repr(release_dir),
        venv_py=repr(VENV),
    )
    return _USER_DATA.substitute(
        release=release,
        release_dir=release_dir,
        install=install.rstrip("\n"),
        fetch_env=fetch_env.rstrip("\n"),
        env_file=ENV_FILE,
        venv=VENV,
        port=str(ORIGIN_PORT),
        admin_port=str(ADMIN_PORT),
        watchdog_sec=str(WATCHDOG_SECONDS),
        caddyfile=render_caddyfile(site, acme=acme, load_balanced=load_balanced),
        log_env=(
            # The request log's durable files, in the release bucket (the role may put
            # objects under this prefix only); an SSM parameter of the same name wins.
            f"Environment=PRISM_LOG_BUCKET={bucket}\n"
            f"Environment=PRISM_LOG_PREFIX={log_prefix}\n"
            f"Environment=AWS_DEFAULT_REGION={region}\n"
            if log_prefix
            else ""
        ),
    )
