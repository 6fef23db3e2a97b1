"""Render the origin instance's cloud-init user-data (a bash script).

The script installs Python, the gateway package and Caddy, and writes:

- ``/opt/prism/bin/prism-fetch-env``: run as the unit's ``ExecStartPre``; reads
  the secrets from SSM Parameter Store with the instance role and writes
  ``/run/prism-origin/origin.env`` (mode 0600). Secrets are fetched at every
  start, so a restart (or reboot) picks up new values.
- ``prism-origin.service``: ``prism origin serve --host 127.0.0.1 --port 8080
  --admin-port 9090``.
- ``/etc/caddy/Caddyfile``: HTTPS on 443 reverse-proxying to the origin's public
  port only; the admin port (detailed /healthz, /metrics) stays on loopback, for
  an agent on the instance or an SSM port forward.

User-data is readable by anyone who can describe the instance, so it carries
only the region, the parameter path and parameter *names*, never a value.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping

__all__ = [
    "ADMIN_PORT",
    "ENV_FILE",
    "FILE_SECRETS",
    "ORIGIN_PORT",
    "ami_parameters",
    "render_caddyfile",
    "render_user_data",
]

ORIGIN_PORT = 8080
ADMIN_PORT = 9090
ENV_FILE = "/run/prism-origin/origin.env"
# Secrets whose value is a file's content: written next to the env file and
# the variable is pointed at that copy.
FILE_SECRETS: Mapping[str, str] = {"PRISM_PROVIDERS_FILE": "providers.toml"}

# The script needs apt, systemd and Python 3.11+: Debian 12 first, else Ubuntu 24.04.
_AMI_PARAMETERS = {
    "amd64": (
        "/aws/service/debian/release/12/latest/amd64",
        "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
    ),
    "arm64": (
        "/aws/service/debian/release/12/latest/arm64",
        "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id",
    ),
}
_ARM_FAMILY = re.compile(r"^[a-z]+\d+g[a-z]*$")  # Graviton: t4g, m7g, c6gn, ...
_SAFE = re.compile(r"^[A-Za-z0-9_.:/@+=,\[\]-]*$")


class _Template(string.Template):
    # Bash is full of `$`; an unusual delimiter keeps the template readable.
    delimiter = "@@"


_FETCH_ENV = '''\
#!/opt/prism/venv/bin/python
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
    # systemd EnvironmentFile double-quote escapes: \\ \\" \\$ \\`
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

_USER_DATA = _Template("""\
#!/bin/bash
# Prism origin bootstrap, rendered by `prism deploy origin`.
# Holds SSM parameter names and the region only; secrets are fetched at start.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

apt-get update
apt-get install -y --no-install-recommends \\
    ca-certificates git python3 python3-venv caddy
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \\
    || { echo "prism: Python 3.11+ required (Debian 12 / Ubuntu 24.04)" >&2; exit 1; }

id prism >/dev/null 2>&1 \\
    || useradd --system --home-dir /opt/prism --shell /usr/sbin/nologin prism
install -d -m 0755 /opt/prism /opt/prism/bin
python3 -m venv /opt/prism/venv
/opt/prism/venv/bin/pip install --upgrade pip
/opt/prism/venv/bin/pip install @@package_sh

cat > /opt/prism/bin/prism-fetch-env <<'PRISM_EOF'
@@fetch_env
PRISM_EOF
chmod 0755 /opt/prism/bin/prism-fetch-env

cat > /etc/systemd/system/prism-origin.service <<'PRISM_EOF'
[Unit]
Description=Prism origin (OpenAI-compatible LLM gateway)
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
ExecStartPre=/opt/prism/bin/prism-fetch-env
# `-`: the file does not exist until ExecStartPre has written it.
EnvironmentFile=-@@env_file
ExecStart=/opt/prism/venv/bin/prism origin serve --host 127.0.0.1 --port @@port \\
    --admin-host 127.0.0.1 --admin-port @@admin_port
Restart=always
RestartSec=5
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=yes

[Install]
WantedBy=multi-user.target
PRISM_EOF

cat > /etc/caddy/Caddyfile <<'PRISM_EOF'
@@caddyfile
PRISM_EOF

systemctl daemon-reload
systemctl enable --now prism-origin.service
systemctl restart caddy.service
""")


def ami_parameters(instance_type: str) -> tuple[str, ...]:
    """SSM public parameters naming the latest supported AMI for ``instance_type``, in order."""
    family = instance_type.split(".", 1)[0]
    return _AMI_PARAMETERS["arm64" if _ARM_FAMILY.match(family) else "amd64"]


def render_caddyfile(site: str, *, acme: bool) -> str:
    """Caddyfile for ``site``: a domain (public ACME certificate) or an IP (``tls internal``)."""
    if acme:
        # Port 80 stays closed, so only TLS-ALPN-01 (on 443) can answer ACME.
        global_block = ""
        tls = "\ttls {\n\t\tissuer acme {\n\t\t\tdisable_http_challenge\n\t\t}\n\t}\n"
    else:
        # Clients dialling an IP send no SNI; default_sni picks the IP's certificate.
        global_block = f"{{\n\tdefault_sni {site}\n}}\n\n"
        tls = "\ttls internal\n"
    return (
        f"{global_block}"
        f"https://{site} {{\n"
        f"{tls}"
        f"\treverse_proxy 127.0.0.1:{ORIGIN_PORT} {{\n"
        # Stream SSE chunks through as they arrive.
        "\t\tflush_interval -1\n"
        "\t}\n"
        "}"
    )


def render_user_data(
    *,
    region: str,
    parameter_path: str,
    required: tuple[str, ...],
    package: str,
    site: str,
    acme: bool,
) -> str:
    """The instance's user-data; every argument is a name, never a secret value."""
    for label, value in (("region", region), ("parameter path", parameter_path), ("site", site)):
        if not _SAFE.match(value):
            raise ValueError(f"unsafe {label} for user-data: {value!r}")
    if "\n" in package:
        raise ValueError("package spec must be a single line")
    fetch_env = _Template(_FETCH_ENV).substitute(
        region_py=repr(region),
        path_py=repr(parameter_path),
        required_py=repr(tuple(required)),
        files_py=repr(dict(FILE_SECRETS)),
    )
    return _USER_DATA.substitute(
        package_sh=shlex.quote(package),
        fetch_env=fetch_env.rstrip("\n"),
        env_file=ENV_FILE,
        port=str(ORIGIN_PORT),
        admin_port=str(ADMIN_PORT),
        caddyfile=render_caddyfile(site, acme=acme),
    )
