"""Deploy the Prism origin to one AWS region with boto3: EC2 behind Caddy, secrets in SSM.

One stack is a (name, region) pair; every resource is tagged ``prism:stack``,
``prism:role=origin`` and ``prism:region`` and found again by those tags, so
``apply`` is idempotent and a second region is an independent stack.

- Release: a wheel of this checkout and a hash-checked lock for the instance's
  Python (:mod:`deploy.release`), stored in the region's bucket
  ``prism-releases-<account>-<region>`` under ``origin/<name>/releases/<id>/``;
  the instance fetches them with its role and installs them with
  ``pip install --require-hashes``. The lock is reused (``origin/<name>/locks/``)
  while the dependencies and the target are unchanged, so the same tree is the
  same release.
- Image: Ubuntu 24.04 LTS (Python 3.12), from Canonical's SSM public
  parameter unless ``--ami`` names one; tagged ``prism:image`` and
  ``prism:python`` with the release (``prism:release``).
- Security group ``prism-origin-<name>``: TCP 443 from 0.0.0.0/0 and ::/0,
  nothing else (no SSH, no 80: Session Manager instead). Certificates come from
  ACME TLS-ALPN-01, which Caddy answers on 443.
- Secrets: one ``SecureString`` parameter per secret under
  ``<prefix><name>/``. A secret this deploy does not set is kept, never
  dropped (``--remove-secret`` deletes one).
- IAM role + instance profile ``prism-origin-<name>-<region>``: may read only
  that parameter path and the stack's release objects, plus Session Manager.
- Elastic IP: a stable address for the domain's DNS record.
- Updates are blue/green: a new launch spec (release, image, type, user-data)
  means a new instance; the Elastic IP moves to it only once it answers
  ``/healthz`` over HTTPS with the expected version, then the old one is
  terminated. A new instance that never gets healthy is terminated and the old
  one keeps serving. Same spec and changed secrets: the instance reboots (the
  unit refetches them at start). Nothing changed: nothing is touched.
  ``rollback`` relaunches the release that served before the current one.
"""

from __future__ import annotations

import hashlib
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from deploy.aws.userdata import (
    IMAGE,
    ami_parameters,
    architecture,
    render_user_data,
)
from deploy.release import TARGETS, Release, Target
from prism import parse_key_secrets

if TYPE_CHECKING:
    import boto3
    from mypy_boto3_ec2.type_defs import TagTypeDef

__all__ = [
    "BASE_SECRETS",
    "DEFAULT_INSTANCE_TYPE",
    "DEFAULT_NAME",
    "DEFAULT_PARAMETER_PREFIX",
    "DEFAULT_REGION",
    "PROVIDER_KEYS",
    "Action",
    "DeployConfigError",
    "DeployError",
    "DeployPlan",
    "DeployResult",
    "HealthCheck",
    "OriginDeployConfig",
    "PlanStep",
    "ReleaseBuilder",
    "ReleaseRef",
    "apply",
    "plan",
    "required_secrets",
]

DEFAULT_REGION = "ap-south-1"
DEFAULT_NAME = "main"
DEFAULT_INSTANCE_TYPE = "t3.small"
DEFAULT_PARAMETER_PREFIX = "/prism/origin/"
# What the origin refuses to start without (origin/settings.py); REDIS_URL because the
# instance runs no Redis of its own.
BASE_SECRETS = ("REDIS_URL", "PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET")
# Without PRISM_PROVIDERS_FILE the origin configures a provider per key that is set.
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
_MIN_FORWARD_SECRET = 16  # origin/settings.py's rule
_TAG_STACK, _TAG_ROLE, _TAG_REGION = "prism:stack", "prism:role", "prism:region"
_MAX_SECRET_BYTES = 8192  # the SSM Advanced tier limit; Intelligent-Tiering picks the tier

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9-]+\.[a-z0-9]+$")
_DOMAIN_RE = re.compile(r"^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
_PREFIX_RE = re.compile(r"^/(?:[A-Za-z0-9_.-]+/)*$")
_SECRET_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")

Progress = Callable[[str], None]
Action = Literal["created", "updated", "replaced", "unchanged"]
#: ``(address, expected release id) -> None`` when ``https://address/healthz`` answers
#: healthy with that version, else why not. Injected so tests can play the instance.
HealthCheck = Callable[[str, str], str | None]
#: Given the stored lock for the checkout's dependencies (or None), the release to ship.
ReleaseBuilder = Callable[[str | None], Release]


class DeployError(Exception):
    """A deploy step failed. Messages name resources, never secret values."""


class DeployConfigError(DeployError, ValueError):
    """The deploy configuration is invalid."""


def required_secrets(secrets: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets the origin needs given these: the base ones plus the provider keys.

    With ``PRISM_PROVIDERS_FILE`` (its content), every ``api_key_env`` it names;
    without, at least one of :data:`PROVIDER_KEYS` (checked by the caller).
    """
    providers = secrets.get("PRISM_PROVIDERS_FILE")
    if not providers:
        return BASE_SECRETS
    try:
        tables = tomllib.loads(providers).get("providers", {})
    except tomllib.TOMLDecodeError as error:
        raise DeployConfigError(f"PRISM_PROVIDERS_FILE is not valid TOML: {error}") from None
    if not isinstance(tables, dict) or not tables:
        raise DeployConfigError("PRISM_PROVIDERS_FILE has no [providers.NAME] tables")
    keys = [t.get("api_key_env") for t in tables.values() if isinstance(t, dict)]
    return (*BASE_SECRETS, *sorted({k for k in keys if isinstance(k, str) and k}))


@dataclass(frozen=True, slots=True)
class ReleaseRef:
    """A stored release: enough to render user-data and check the instance's version."""

    id: str
    wheel_name: str
    files: Mapping[str, str]  # object name -> sha256, as the instance checks them
    python: str
    image: str

    @classmethod
    def of(cls, release: Release) -> ReleaseRef:
        requirements = hashlib.sha256(release.requirements.encode()).hexdigest()
        return cls(
            id=release.id,
            wheel_name=release.wheel_name,
            files={release.wheel_name: release.wheel_sha256, "requirements.txt": requirements},
            python=release.target.python,
            image=release.target.os,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "files": dict(self.files)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleaseRef:
        return cls(
            id=str(data["id"]),
            wheel_name=str(data["wheel_name"]),
            files={str(k): str(v) for k, v in dict(data["files"]).items()},
            python=str(data["python"]),
            image=str(data["image"]),
        )


@dataclass(frozen=True, kw_only=True)
class OriginDeployConfig:
    """What to deploy where. ``secrets`` maps env var name → value and is never printed."""

    secrets: Mapping[str, str] = field(repr=False)
    region: str = DEFAULT_REGION
    name: str = DEFAULT_NAME
    instance_type: str = DEFAULT_INSTANCE_TYPE
    domain: str | None = None
    ami: str | None = None
    parameter_prefix: str = DEFAULT_PARAMETER_PREFIX
    remove_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = (
            ("region", self.region, _REGION_RE),
            ("name", self.name, _NAME_RE),
            ("instance type", self.instance_type, _INSTANCE_TYPE_RE),
            ("parameter prefix", self.parameter_prefix, _PREFIX_RE),
        )
        for label, value, pattern in checks:
            if not pattern.match(value):
                raise DeployConfigError(f"invalid {label}: {value!r}")
        if self.parameter_prefix.lower().startswith(("/aws/", "/ssm/")):
            raise DeployConfigError("parameter prefix must not start with /aws/ or /ssm/")
        if self.domain is not None:
            object.__setattr__(self, "domain", self.domain.lower().rstrip("."))
            if not _DOMAIN_RE.match(self.domain or ""):
                raise DeployConfigError(f"invalid domain: {self.domain!r}")
        if self.ami is not None and not _AMI_RE.match(self.ami):
            raise DeployConfigError(f"invalid AMI id: {self.ami!r}")
        self._check_secrets()
        # Freeze a private copy so later changes to the caller's dict cannot leak in.
        object.__setattr__(self, "secrets", MappingProxyType(dict(self.secrets)))
        object.__setattr__(self, "remove_secrets", tuple(self.remove_secrets))

    def _check_secrets(self) -> None:
        required = required_secrets(self.secrets)
        missing = [name for name in required if not self.secrets.get(name)]
        if missing:
            raise DeployConfigError(f"missing required secret(s): {', '.join(missing)}")
        if "PRISM_PROVIDERS_FILE" not in self.secrets and not any(
            self.secrets.get(k) for k in PROVIDER_KEYS
        ):
            raise DeployConfigError(
                f"no provider key: set {' or '.join(PROVIDER_KEYS)}, or PRISM_PROVIDERS_FILE"
            )
        try:
            parse_key_secrets(self.secrets["PRISM_KEY_SECRET"])
        except ValueError as error:
            raise DeployConfigError(f"invalid PRISM_KEY_SECRET: {error}") from None
        if len(self.secrets["PRISM_FORWARD_SECRET"]) < _MIN_FORWARD_SECRET:
            raise DeployConfigError(
                f"PRISM_FORWARD_SECRET must be at least {_MIN_FORWARD_SECRET} characters"
            )
        for name, value in self.secrets.items():
            if not _SECRET_NAME_RE.match(name):
                raise DeployConfigError(f"invalid secret name: {name!r}")
            if not value:
                raise DeployConfigError(f"secret {name} is empty")
            if len(value.encode()) > _MAX_SECRET_BYTES:
                raise DeployConfigError(f"secret {name} is larger than {_MAX_SECRET_BYTES} bytes")
        for name in self.remove_secrets:
            if not _SECRET_NAME_RE.match(name):
                raise DeployConfigError(f"invalid secret name: {name!r}")
            if name in self.secrets or name in required:
                raise DeployConfigError(f"cannot both set and remove secret {name}")

    @property
    def parameter_path(self) -> str:
        """SSM path holding this stack's parameters (no trailing slash)."""
        return f"{self.parameter_prefix}{self.name}"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Full SSM parameter names of the secrets this deploy sets, sorted."""
        return tuple(f"{self.parameter_path}/{name}" for name in sorted(self.secrets))

    @property
    def security_group_name(self) -> str:
        return f"prism-origin-{self.name}"

    @property
    def role_name(self) -> str:
        # IAM is global: the region keeps two regional stacks from sharing a role.
        return f"prism-origin-{self.name}-{self.region}"

    @property
    def release_prefix(self) -> str:
        """The stack's key prefix in the region's release bucket."""
        return f"origin/{self.name}/"

    @property
    def target(self) -> Target:
        """The instance's image, Python and platform (from the instance type's architecture)."""
        return TARGETS["aarch64" if architecture(self.instance_type) == "arm64" else "x86_64"]

    @property
    def ami_source(self) -> str:
        """The explicit AMI, or the SSM public parameter it will be looked up from."""
        return self.ami or " or ".join(ami_parameters(self.instance_type))

    def tags(self) -> list[TagTypeDef]:
        return [
            {"Key": _TAG_STACK, "Value": self.name},
            {"Key": _TAG_ROLE, "Value": "origin"},
            {"Key": _TAG_REGION, "Value": self.region},
        ]

    def user_data(self, site: str, bucket: str, release: ReleaseRef) -> str:
        """Cloud-init script serving ``site`` (the domain, or the Elastic IP without one)."""
        return render_user_data(
            region=self.region,
            parameter_path=self.parameter_path,
            required=required_secrets(self.secrets),
            site=site,
            acme=self.domain is not None,
            bucket=bucket,
            prefix=f"{self.release_prefix}releases/{release.id}/",
            release=release.id,
            files=release.files,
        )


@dataclass(frozen=True)
class PlanStep:
    """One resource and what ``apply`` does to it."""

    resource: str
    name: str
    action: str


@dataclass(frozen=True)
class DeployPlan:
    """A pure description of ``apply``: resource names only, no values."""

    region: str
    name: str
    site: str
    tls: str
    image: str
    python: str
    steps: tuple[PlanStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeployResult:
    """What ``apply`` did and where the origin now lives."""

    region: str
    name: str
    action: Action
    instance_id: str
    public_ip: str
    public_dns: str | None
    url: str
    security_group_id: str
    allocation_id: str
    instance_profile: str
    release: str
    previous_release: str | None
    bucket: str
    parameter_names: tuple[str, ...]
    parameters_changed: tuple[str, ...]
    parameters_kept: tuple[str, ...]
    restarted: bool
    rolled_back: bool = False
    terminated_instance_ids: tuple[str, ...] = ()

    @property
    def created(self) -> bool:
        return self.action == "created"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(config: OriginDeployConfig, *, source: str = ".", rollback: bool = False) -> DeployPlan:
    """Describe what ``apply`` would do, without calling AWS, building or reading the network."""
    path = config.parameter_path
    target = config.target
    bucket = f"prism-releases-<account>-{config.region}"
    kept = "keep stored parameters this deploy does not set"
    if config.remove_secrets:
        kept += f"; delete {', '.join(config.remove_secrets)}"
    if rollback:
        release_steps = [
            PlanStep("release", "previous", "the release that served before the current one"),
        ]
    else:
        release_steps = [
            PlanStep("wheel", source, "build a reproducible wheel of the checkout (uv build)"),
            PlanStep(
                "lock",
                f"{bucket}/{config.release_prefix}locks/",
                f"reuse, or pin with hashes for Python {target.python} on {target.platform}",
            ),
            PlanStep(
                "s3-object",
                f"{bucket}/{config.release_prefix}releases/<release id>/",
                "upload the wheel and requirements.txt unless stored",
            ),
        ]
    steps = [
        PlanStep(
            "security-group",
            config.security_group_name,
            "create or reuse; allow only tcp/443 from 0.0.0.0/0 and ::/0, revoke anything else",
        ),
        *(
            PlanStep("ssm-parameter", f"{name} = ***", "put SecureString (overwrite if changed)")
            for name in config.parameter_names
        ),
        PlanStep("ssm-parameter", f"{path}/*", kept),
        *release_steps,
        PlanStep(
            "iam-role",
            config.role_name,
            f"create or reuse role + instance profile; may read only {path}/* and the "
            "stack's release objects; Session Manager",
        ),
        PlanStep("elastic-ip", config.security_group_name, "allocate or reuse"),
        PlanStep(
            "instance",
            f"{_TAG_STACK}={config.name}",
            f"launch {config.instance_type} ({IMAGE}, Python {target.python}) from "
            f"{config.ami_source} when the release or launch spec changed; move the Elastic "
            "IP once it answers /healthz over HTTPS with the release, then terminate the old "
            "one (an unhealthy new one is terminated instead); reboot when only secrets "
            "changed; otherwise nothing",
        ),
    ]
    return DeployPlan(
        region=config.region,
        name=config.name,
        site=config.domain or "the stack's Elastic IP",
        tls=_tls_mode(config),
        image=IMAGE,
        python=target.python,
        steps=tuple(steps),
    )


def apply(
    config: OriginDeployConfig,
    session: boto3.Session,
    progress: Progress = lambda _: None,
    *,
    release: ReleaseBuilder | None = None,
    lock_key: str = "",
    rollback: bool = False,
    health_check: HealthCheck | None = None,
    keep_failed: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> DeployResult:
    """Create or update the stack for ``config`` and return where the origin runs.

    ``release`` builds the release (given the stored lock for ``lock_key``, if
    any); with ``rollback`` the previous release is relaunched instead.
    """
    # Imported here: deploy.aws.deployer imports this module's config, result and errors.
    from deploy.aws.deployer import Deployer
    from deploy.aws.health import check_health

    if (release is None) == (not rollback):
        raise DeployConfigError("give either a release to build or rollback, not both")
    deployer = Deployer(
        config,
        session,
        progress,
        sleep,
        health_check=health_check or check_health,
        keep_failed=keep_failed,
    )
    return deployer.run(release, lock_key, rollback=rollback)


def _tls_mode(config: OriginDeployConfig) -> str:
    if config.domain:
        return "public certificate via ACME TLS-ALPN-01 on 443 (point the domain at the Elastic IP)"
    return "tls internal (self-signed; the edge needs --domain)"
